"""The worker's scratch directory for a model's files (the config and tokenizer a peer
sent, the full model a split client gathers), and reclaiming those that dead clients left.

A SIGKILLed client never runs `TemporaryDirectory`'s cleanup: its directory stays in the
temp dir, a model's files each time (a chaos run leaves one per kill). So each scratch
directory holds an open file with an exclusive `flock` for its owner's lifetime; the
kernel drops the lock when the owner dies, however it dies. A client starting up removes
every scratch directory whose lock it can take: its owner is gone. A live owner's lock
is never free, so a live client's directory is never touched (pids are not used: they
are reused, and another container's are not ours to see).

    scratch = ModelScratch()        # reclaims stale ones, then makes and locks its own
    scratch.path / "config.json"
    scratch.cleanup()               # at the worker's close (also at exit if forgotten)
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import IO

PREFIX = "psyche-client-model-"
OWNER_LOCK = ".owner.lock"


def _owner_alive(directory: Path) -> bool:
    """Whether a live process holds `directory`'s owner lock (a directory without one is
    counted as live: it may be being made right now, between mkdtemp and the lock)."""
    try:
        handle = (directory / OWNER_LOCK).open("r")  # never created here
    except OSError:
        return True
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def reclaim_stale_scratch(root: Path | None = None) -> list[Path]:
    """Remove the scratch directories under `root` (the temp dir) whose owner died;
    returns them."""
    base = Path(root if root is not None else tempfile.gettempdir())
    reclaimed = []
    for directory in base.glob(PREFIX + "*"):
        if directory.is_dir() and not directory.is_symlink() and not _owner_alive(directory):
            shutil.rmtree(directory, ignore_errors=True)
            reclaimed.append(directory)
    return reclaimed


def _remove(path: Path, lock: IO[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        lock.close()


class ModelScratch:
    """This client's scratch directory, locked as long as it lives."""

    def __init__(self, root: Path | None = None):
        self.reclaimed = reclaim_stale_scratch(root)
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
        self._lock = (self.path / OWNER_LOCK).open("w")
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._finalizer = weakref.finalize(self, _remove, self.path, self._lock)

    @property
    def name(self) -> str:
        return str(self.path)

    def cleanup(self) -> None:
        self._finalizer()
