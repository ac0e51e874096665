"""What is left running: processes of a session and their command lines, from /proc (the
stop tests of the coordinator, the client and the testnet); and stopping a helper
process a test started (a registry, Prometheus, a validator)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any


def stop_process(process: subprocess.Popen[Any] | None, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after `grace_s`; reaped either way."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""
