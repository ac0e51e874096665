"""Stopping a program cleanly on SIGINT, SIGTERM and SIGHUP, with or without a Textual TUI.

    stop = StopSignals()               # in a running event loop
    stop.install()                     # SIGINT, SIGTERM, SIGHUP -> stop.event, stop.signal
    await stop.event.wait()
    say(f"stopping… ({stop.reason})")  # one line on stderr, even on a terminal that hung up

`psyche-coordinator run`, `psyche-testnet`, `psyche-client train` and the run-manager use
it (a later signal while stopping is counted, `stop.count`, so a program may hurry).
Closing a terminal sends SIGHUP and leaves the terminal hung up: every write to it fails
(EIO). `say` never raises, and on SIGHUP `silence_hung_up_terminal` points stdout and
stderr at /dev/null where they were that terminal, so logging and the interpreter's final
flush stay quiet too.

Outside an event loop (a program still starting, or its loop already closed)
`exit_on_signals` makes the same three signals end the process at once: a program that is
PID 1 in a container gets no signal it has no handler for, so without one it would ignore
`docker stop`'s SIGTERM until it is killed. `exit_after` is a stop's deadline: a stop
that has not ended by then ends the process (`exit_now`) whatever is still running.

`run_app_until_stopped` runs a Textual app until it quits or a signal comes (then it
asks the app to say "stopping…" and exit, bounded). Textual writes the screen from a
writer thread; when a write fails that thread dies and
the app's shutdown then blocks forever on its full queue (textual 8). `hangup_safe_driver`
gives the TUIs a driver whose output swallows those errors (used by both apps'
`get_driver_class`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import sys
import threading
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from collections.abc import Callable

    from textual.app import App
    from textual.driver import Driver

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def say(line: str) -> None:
    """A line on stderr that never raises (a terminal that is gone must not stop a stop;
    nor a signal handler's write into a write in progress: RuntimeError, reentrant call)."""
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        print(line, file=sys.stderr, flush=True)


def silence_hung_up_terminal() -> None:
    """Point stdout and stderr at /dev/null where they are a terminal that hung up (a
    character device that no longer answers as a tty); pipes, files and a live terminal
    are left alone."""
    for fd in (1, 2):
        try:
            hung_up = stat.S_ISCHR(os.fstat(fd).st_mode) and not os.isatty(fd)
        except OSError:
            continue
        if hung_up:
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, fd)
                os.close(devnull)


def exit_now(code: int, line: str | None = None) -> NoReturn:
    """End the process at once: `line` on stderr, then no cleanup and no waiting for
    threads (the last resort of a stop; what must stay consistent on disk is written
    atomically, so an interrupted write leaves nothing half done)."""
    try:
        if line:
            say(line)
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            sys.stdout.flush()
    finally:
        os._exit(code)


def exit_on_signals(code: int, line: Callable[[signal.Signals], str]) -> None:
    """Until an event loop takes them over (`StopSignals.install`), or after it gave them
    back: SIGINT, SIGTERM and SIGHUP say `line(signal)` and end the process with `code` at
    once (main thread only, as every Python signal handler)."""

    def handler(signum: int, _frame: object) -> None:
        sig = signal.Signals(signum)
        if sig is signal.SIGHUP:
            silence_hung_up_terminal()
        exit_now(code, line(sig))

    for sig in STOP_SIGNALS:
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            signal.signal(sig, handler)


def exit_after(delay_s: float, code: int, line: str,
               before: Callable[[], None] | None = None) -> threading.Timer:
    """A stop's deadline: unless cancelled first, `before()` then `exit_now(code, line)`
    in `delay_s`, from a daemon thread (it fires even while the main thread is blocked,
    e.g. waiting for a worker thread at the interpreter's exit)."""

    def fire() -> None:
        if before is not None:
            with contextlib.suppress(Exception):
                before()
        exit_now(code, line)

    timer = threading.Timer(delay_s, fire)
    timer.daemon = True
    timer.start()
    return timer


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP set `event`; `signal` is the first one received."""

    def __init__(self, event: asyncio.Event | None = None) -> None:
        self.event = event or asyncio.Event()
        self.signal: signal.Signals | None = None
        self.count = 0
        self._installed: list[signal.Signals] = []
        self._listeners: list[Any] = []

    @property
    def reason(self) -> str:
        return self.signal.name if self.signal is not None else "stop"

    def on_signal(self, callback: Any) -> None:
        """Also call `callback(signal)` on every signal (e.g. to tell a TUI)."""
        self._listeners.append(callback)

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._received, sig)
                self._installed.append(sig)

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._installed:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)
        self._installed.clear()

    def _received(self, sig: signal.Signals) -> None:
        if sig is signal.SIGHUP:
            silence_hung_up_terminal()
        if self.signal is None:
            self.signal = sig
        self.count += 1
        self.event.set()
        for callback in list(self._listeners):
            with contextlib.suppress(Exception):
                callback(sig)


class _TolerantOutput:
    """Textual's output file, where a failed write (a hung-up terminal) drops the rest
    instead of raising in the writer thread."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self.failed = False

    def write(self, text: str) -> int:
        if not self.failed:
            try:
                self._file.write(text)
            except (OSError, ValueError):
                self.failed = True
        return len(text)

    def flush(self) -> None:
        if not self.failed:
            try:
                self._file.flush()
            except (OSError, ValueError):
                self.failed = True

    def fileno(self) -> int:
        return int(self._file.fileno())

    def isatty(self) -> bool:
        return True


def hangup_safe_driver(driver_class: type[Driver]) -> type[Driver]:
    """`driver_class`, or when it is Textual's Linux driver a subclass whose output
    survives a hung-up terminal (so the app can still exit)."""
    try:
        from textual.drivers.linux_driver import LinuxDriver
    except ImportError:  # not a POSIX terminal driver
        return driver_class
    if not issubclass(driver_class, LinuxDriver):
        return driver_class

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        driver_class.__init__(self, *args, **kwargs)
        self._file = _TolerantOutput(self._file)

    return type(f"HangupSafe{driver_class.__name__}", (driver_class,), {"__init__": __init__})


APP_EXIT_TIMEOUT_S = 2.0


async def run_app_until_stopped(app: App[Any], signals: StopSignals,
                                stop_for: Callable[[str], None]) -> None:
    """Run `app` until it exits by itself (a key) or `signals` fires; then `stop_for(reason)`
    (the app says "stopping…" and exits) and wait for it, at most APP_EXIT_TIMEOUT_S: a
    terminal that hung up must not hold the stop (the app is cancelled then)."""
    app_task = asyncio.create_task(app.run_async())
    stop_task = asyncio.create_task(signals.event.wait())
    try:
        await asyncio.wait({app_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if not app_task.done():
            stop_for(signals.reason)
            done, _ = await asyncio.wait({app_task}, timeout=APP_EXIT_TIMEOUT_S)
            if not done:
                app_task.cancel()
                await asyncio.wait({app_task}, timeout=1)
        if app_task.done() and not app_task.cancelled() and app_task.exception() is not None:
            say(f"the TUI failed: {app_task.exception()!r}")
    finally:
        stop_task.cancel()
