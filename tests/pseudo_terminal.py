"""A real pseudo-terminal for a process under test (the stop tests of the coordinator's and
the testnet's TUIs): it becomes the process's controlling terminal, as in a shell, and is
drained in a thread, so the TUI never blocks on a full buffer. `hang_up()` closes it as a
closed terminal window does: the kernel sends SIGHUP and every later write fails."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import threading
from pathlib import Path


class Terminal:
    def __init__(self, rows: int = 30, columns: int = 120) -> None:
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.output = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)

    def spawn(self, args: list[str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """Start `args` in a session of its own, with this terminal as its own."""
        def controlling_terminal() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        process = subprocess.Popen(
            args, cwd=cwd, stdin=self.slave, stdout=self.slave, stderr=self.slave,
            start_new_session=True, preexec_fn=controlling_terminal,  # noqa: PLW1509
            env={**os.environ, "TERM": "xterm-256color"})
        os.close(self.slave)
        self._thread.start()
        return process

    def _drain(self) -> None:
        while not self._stop.is_set():
            if not select.select([self.master], [], [], 0.1)[0]:
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.output.extend(data)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def text(self) -> str:
        """What it showed, without the escape sequences."""
        return re.sub(r"\x1b\[[0-9;?<>=$]*[a-zA-Z~]", "", self.output.decode(errors="replace"))

    def hang_up(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)  # (a read in progress would keep the terminal open)
        os.close(self.master)
        self.master = -1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.master >= 0:
            os.close(self.master)
            self.master = -1
