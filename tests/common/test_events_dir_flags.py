"""`--events-dir` on `psyche-coordinator run` and `psyche-client train`: a path that cannot
hold event files is one line and exit 2, before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tcp_helpers import TESTNET

BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)


def test_coordinator_refuses_a_file_as_events_dir(tmp_path: Path) -> None:
    a_file = tmp_path / "events"
    a_file.write_text("")
    done = run(str(BIN / "psyche-coordinator"), "run", "--state", str(TESTNET / "state.toml"),
               "--server-port", "0", "--events-dir", str(a_file))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: --events-dir {a_file} is not a directory"


def test_client_refuses_a_file_as_events_dir(tmp_path: Path) -> None:
    a_file = tmp_path / "events"
    a_file.write_text("")
    done = run(str(BIN / "psyche-client"), "train", "--run-id", "r", "--server-addr",
               "127.0.0.1:1", "--device", "cpu", "--events-dir", str(a_file))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: --events-dir {a_file} is not a directory"
