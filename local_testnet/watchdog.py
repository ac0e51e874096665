"""The testnet's watchdog: its process groups do not outlive it, even after a SIGKILL.

    python local_testnet/watchdog.py GRACE_S      (stdin: "+PGID" / "-PGID" lines)

`Testnet` starts this script in a session of its own (so a terminal's SIGHUP or a
Ctrl+C never reaches it) with a pipe on its stdin, and writes `+PGID` for every process
group it starts (the coordinator, each client with its ranks) and `-PGID` once it has
stopped one. When the pipe closes, the testnet is gone — stopped cleanly (it stopped every
group first, so there is nothing to do) or killed — and the watchdog sends SIGTERM to every
group still alive, waits up to GRACE_S seconds, sends SIGKILL to what is left and exits.

Standard library only, run as a script (not `-m`): it starts in a few milliseconds. Linux
lists group members through /proc (zombies, already dead, are not counted); elsewhere
`killpg(pgid, 0)` answers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path

POLL_S = 0.05


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is alive (a zombie is not)."""
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            # after "(comm)": state, ppid, pgrp, ...
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def end_groups(groups: Iterable[int], grace_s: float) -> None:
    """SIGTERM every live group, then SIGKILL whatever is still alive after `grace_s`."""
    alive = [pgid for pgid in groups if group_alive(pgid)]
    for pgid in alive:
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)
        alive = [pgid for pgid in alive if group_alive(pgid)]
    for pgid in alive:
        signal_group(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    grace_s = float(argv[1]) if len(argv) > 1 else 10.0
    for sig in (signal.SIGINT, signal.SIGHUP):  # the testnet decides; EOF is the cue
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    for raw in sys.stdin.buffer:
        line = raw.strip()
        with contextlib.suppress(ValueError):
            if line.startswith(b"+"):
                groups.add(int(line[1:]))
            elif line.startswith(b"-"):
                groups.discard(int(line[1:]))
    end_groups(sorted(groups), grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
