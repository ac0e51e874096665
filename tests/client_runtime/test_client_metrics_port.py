"""A client whose --metrics-local-port is taken (a second client on the host) stops at once
with one line naming the port, before its P2P node starts: no traceback."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_taken_metrics_port_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "psyche-client"), "train", "--run-id", "x",
             "--server-addr", "127.0.0.1:1", "--metrics-local-port", str(port),
             "--device", "cpu", "--iroh-relay", "disabled", "--logs", "none"],
            check=False, capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: --metrics-local-port {port}: cannot listen on 127.0.0.1:{port} "
        "(Address already in use); is another client running on this host?")
