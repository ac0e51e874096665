"""A real TCP coordinator for the run-manager tests that follow one (test_rm_headless.py,
test_rm_coordinator_silent.py): `psyche-coordinator run` of the local-testnet run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loopback import free_port
from tcp_run import write_run_files


def start_coordinator(directory: Path, run_id: str) -> tuple[subprocess.Popen[bytes], int]:
    """`psyche-coordinator run` of the local-testnet run `run_id` (client version 0.1.0) on
    a free loopback port, its files under `directory` and its output in
    directory/coordinator.log: (the process, its port). It runs in a session of its own
    (the tests stop or kill it by its pid); the caller stops it."""
    port = free_port()
    state, data = write_run_files(directory / "run", "0.1.0", free_port(), run_id)
    with (directory / "coordinator.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state),
             "--data-config", str(data), "--server-port", str(port), "--bind-host",
             "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT, cwd=directory,
            start_new_session=True)
    return process, port
