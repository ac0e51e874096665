"""A second run on the same host (issue 16, "No dead ends"): the testnet's clients serve
their metrics on 6269 + i unless one of those ports is taken, then on free ports it names;
a base port the user chose and that is taken is a one-line error. The run case is a real
`psyche-testnet` (coordinator and client processes) while another socket holds 6270."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback import free_port

from coordinator.config import ConfigError
from local_testnet.ports import (
    METRICS_BASE_PORT,
    SERVER_PORT,
    pick_metrics_ports,
    pick_server_port,
    port_is_free,
)

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = ROOT / "config" / "operator-walkthrough"  # one client, 4 steps


@contextlib.contextmanager
def holding(port: int) -> Iterator[None]:
    """Keeps `port` taken for the block: listens on it, or it is already someone else's."""
    sock = socket.socket()
    try:
        with contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            sock.listen()
        assert not port_is_free(port)
        yield
    finally:
        sock.close()


def test_the_default_range_when_free_else_free_ports_said_aloud() -> None:
    first = METRICS_BASE_PORT + 1
    with holding(first):
        moved = pick_metrics_ports(None, 3)
    assert set(moved.ports) == {1, 2, 3} and len(set(moved.ports.values())) == 3
    assert first not in moved.ports.values()
    assert moved.note is not None and f"port {first} is in use" in moved.note
    assert all(str(port) in moved.note for port in moved.ports.values())

    base = free_port() - 1  # base + 1 free right now
    kept = pick_metrics_ports(base, 1)
    assert kept.ports == {1: base + 1} and kept.note is None


def test_a_chosen_base_that_is_taken_is_one_line() -> None:
    base = free_port() - 1
    with holding(base + 1), pytest.raises(ConfigError) as refused:
        pick_metrics_ports(base, 2)
    assert refused.value.errors == [
        f"--metrics-base-port {base}: port {base + 1} (a client's metrics port) is in use; "
        "choose another base or leave it out"]


def test_the_cli_refuses_a_taken_chosen_base_in_one_line(tmp_path: Path) -> None:
    base = free_port() - 1
    with holding(base + 1):
        done = subprocess.run(
            [sys.executable, "-m", "local_testnet", "--num-clients", "1", "--config-path",
             str(WALKTHROUGH), "--metrics-base-port", str(base), "--work-dir", str(tmp_path)],
            check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"--metrics-base-port {base}: port {base + 1} (a client's metrics port) is in use; "
        "choose another base or leave it out"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_testnet_beside_a_taken_metrics_port_moves_its_clients_and_finishes(
        tmp_path: Path) -> None:
    with holding(METRICS_BASE_PORT + 1):
        done = subprocess.run(
            [sys.executable, "-m", "local_testnet", "--num-clients", "1", "--config-path",
             str(WALKTHROUGH), "--server-port", str(free_port()), "--work-dir", str(tmp_path),
             "--timeout", "150", "--no-tui"],
            check=False, capture_output=True, text=True, timeout=170, cwd=ROOT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    notes = [line for line in done.stderr.splitlines() if "client metrics on ports" in line]
    assert notes and f"port {METRICS_BASE_PORT + 1} is in use" in notes[0], done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["error"] is None and summary["finished"], summary
    # A client on a taken metrics port now stops with one line (test_client_metrics_port):
    # the run finishing shows the client served its metrics elsewhere.
    assert "--metrics-local-port" not in (tmp_path / "client-1.log").read_text()


def test_the_coordinators_port_moves_off_a_taken_20000_unless_chosen() -> None:
    with holding(SERVER_PORT):
        port, note = pick_server_port(None)
        assert port != SERVER_PORT and note == (
            f"port {SERVER_PORT} is in use (another run on this host?): the coordinator "
            f"listens on {port} instead")
        assert pick_server_port(SERVER_PORT) == (SERVER_PORT, None)  # chosen: checked later


@pytest.mark.parametrize("which", ["server", "data"])
def test_a_taken_server_or_data_port_is_one_line(tmp_path: Path, which: str) -> None:
    port = free_port()
    args = (["--server-port", str(port)] if which == "server"
            else ["--server-port", str(free_port()), "--data-port", str(port)])
    with holding(port):
        done = subprocess.run(
            [sys.executable, "-m", "local_testnet", "--num-clients", "1", "--config-path",
             str(ROOT / "config" / "local-testnet"), "--work-dir", str(tmp_path), *args],
            check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 1 and done.stdout == ""
    lines = [line for line in done.stderr.strip().splitlines() if "fitted" not in line]
    assert lines == [
        f"--server-port {port} is in use (another run on this host?): choose another, or "
        "leave it out" if which == "server" else
        f"the data server's port {port} (the config's 127.0.0.1:{port}) is in use: choose "
        "another with --data-port"]
