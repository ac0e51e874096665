"""Scratch directories of SIGKILLed clients are reclaimed by the next client to start; a
live client's is never touched. The dead owner is a real process killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from client_image.runtime.model_scratch import PREFIX, ModelScratch, reclaim_stale_scratch

OWNER = """
import sys, time
from pathlib import Path
from client_image.runtime.model_scratch import ModelScratch
scratch = ModelScratch(Path(sys.argv[1]))
(scratch.path / "config.json").write_text("{}")
print(scratch.path, flush=True)
time.sleep(600)
"""


def start_owner(root: Path) -> tuple[subprocess.Popen[str], Path]:
    process = subprocess.Popen([sys.executable, "-c", OWNER, str(root)], stdout=subprocess.PIPE,
                               text=True, cwd=Path(__file__).resolve().parents[2])
    assert process.stdout is not None
    return process, Path(process.stdout.readline().strip())


def test_a_killed_clients_scratch_is_reclaimed_and_a_live_ones_kept(tmp_path: Path) -> None:
    killed, killed_dir = start_owner(tmp_path)
    alive, alive_dir = start_owner(tmp_path)
    try:
        os.kill(killed.pid, signal.SIGKILL)  # no cleanup runs: its directory stays
        killed.wait(10)
        assert (killed_dir / "config.json").is_file()
        mine = ModelScratch(tmp_path)
        assert mine.reclaimed == [killed_dir]
        assert not killed_dir.exists()
        assert (alive_dir / "config.json").is_file()  # its owner still holds the lock
        assert reclaim_stale_scratch(tmp_path) == []  # nor is ours taken from us
        assert mine.path.is_dir() and mine.path.name.startswith(PREFIX)
        mine.cleanup()
        assert not mine.path.exists()
    finally:
        alive.kill()
        alive.wait(10)
    assert reclaim_stale_scratch(tmp_path) == [alive_dir]  # once dead, it goes too


def test_unrelated_and_half_made_directories_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / "psyche-client-elsewhere").mkdir()
    half_made = tmp_path / f"{PREFIX}new"  # made, its lock not yet taken: may be live
    half_made.mkdir()
    assert reclaim_stale_scratch(tmp_path) == []
    assert half_made.is_dir()
    assert (tmp_path / "psyche-client-elsewhere").is_dir()
