"""The processes' logs as they grow: each new line of the coordinator's and every client's
log file, in words (`describe_line`: never the raw JSON), prefixed by who wrote it.

The testnet writes each process's output to a file in its work dir; `LogTail` reads what
was added since the last read, a bounded amount at a time, so a chatty client cannot stall
the screen.
"""

from __future__ import annotations

from pathlib import Path

from textual.widgets import RichLog

from local_testnet.client_log import describe_line

READ_BYTES = 256 * 1024  # most bytes read from one file per refresh
LINE_CHARS = 300  # a line longer than this is cut (a whole JSON state, a traceback line)


class LogTail:
    """New complete lines of one growing file, from `start` (a byte offset: the file's size
    when the testnet started, so a reused work dir's old logs are not shown again)."""

    def __init__(self, path: Path, start: int = 0) -> None:
        self.path = path
        self._offset = start
        self._partial = b""

    @staticmethod
    def size_of(path: Path) -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read(READ_BYTES)
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in lines if line.strip()]


class LogPane(RichLog):
    BORDER_TITLE = "Logs"

    def __init__(self, tails: dict[str, LogTail], *, id: str | None = None) -> None:  # noqa: A002  # Textual's keyword
        super().__init__(id=id, max_lines=1000, wrap=True, markup=False)
        self.tails = tails

    def poll(self) -> int:
        """Shows every new line of every source; returns how many there were."""
        shown = 0
        for name, tail in self.tails.items():
            for line in tail.new_lines():
                words = describe_line(line)
                if len(words) > LINE_CHARS:
                    words = words[:LINE_CHARS - 1] + "…"
                self.write(f"{name}: {words}")
                shown += 1
        return shown
