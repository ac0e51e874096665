"""psyche-testnet's own parts: checkpoint comparison, log parsing, config checks, process
lifecycle (a run that cannot start times out cleanly), and the e2e bench smoke test."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopback import free_port
from tcp_helpers import ROOT, TESTNET

from coordinator.config import ConfigError, ServerDataLocation, load_state_file
from local_testnet.testnet import (
    ClientProcess,
    Testnet,
    TestnetOptions,
    checkpoints_identical,
    client_key,
    client_secret_hex,
    run_headless,
)


def _checkpoint(work: Path, client: int, step: int, payload: bytes) -> None:
    directory = work / f"client-{client}" / "checkpoints" / f"run-step{step}"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(payload)
    (directory / "config.json").write_text(f"{client}")  # not compared


def test_checkpoints_compare_the_newest_step_of_finishers(tmp_path: Path) -> None:
    assert checkpoints_identical(tmp_path, "run", [1, 2]) == (False, 0)
    _checkpoint(tmp_path, 1, 5, b"same")
    _checkpoint(tmp_path, 2, 5, b"same")
    _checkpoint(tmp_path, 1, 3, b"old and different")
    assert checkpoints_identical(tmp_path, "run", [1, 2]) == (True, 2)
    _checkpoint(tmp_path, 3, 4, b"killed client, stopped early")
    assert checkpoints_identical(tmp_path, "run", [1, 2, 3]) == (True, 2)
    _checkpoint(tmp_path, 2, 9, b"new")
    _checkpoint(tmp_path, 1, 9, b"NEW")
    assert checkpoints_identical(tmp_path, "run", [1, 2, 3]) == (False, 2)


def test_identities_and_trained_events(tmp_path: Path) -> None:
    assert client_secret_hex(2) == "0" * 63 + "2" and len(client_key(2)) == 32
    assert client_key(1) != client_key(2)
    net = Testnet(TestnetOptions(num_clients=2, config_path=TESTNET, work_dir=tmp_path,
                                 server_port=free_port()))
    client = ClientProcess(1)
    for line in ['{"event": "trained", "step": 3, "loss": 7.5, "seconds": 0.1}',
                 '{"event": "trained", "step": "x", "loss": 1}', "not json {", "{broken",
                 '{"event": "state", "step": 4}', '{"event": "trained", "step": 4, "loss": 7}']:
        net._client_line(client, line)
    assert client.losses == {3: 7.5, 4: 7.0}
    net.clients[1].losses = {3: 8.0, 4: 6.0}
    net.clients[2].losses = {3: 7.0}
    summary = net.summary()
    assert summary["first_loss"] == 7.5 and summary["last_loss"] == 6.0
    assert summary["steps"] == 2 and summary["finished"] is False


def test_config_problems_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="also the data server's port"):
        Testnet(TestnetOptions(num_clients=1, config_path=TESTNET, work_dir=tmp_path,
                               server_port=20001))
    net = Testnet(TestnetOptions(num_clients=1, config_path=TESTNET, work_dir=tmp_path,
                                 data_port=23456))
    rewritten = load_state_file(net.state_path)
    assert rewritten.model.data_location == ServerDataLocation(address="127.0.0.1:23456")
    assert net.state_path.parent == tmp_path
    with pytest.raises(ConfigError, match="cannot read"):
        Testnet(TestnetOptions(num_clients=1, config_path=tmp_path / "none", work_dir=tmp_path))


def test_a_config_waiting_for_more_clients_is_fitted_to_the_testnet(tmp_path: Path) -> None:
    # The default config waits for 3 clients: with 2 it would wait forever.
    net = Testnet(TestnetOptions(num_clients=2, config_path=TESTNET, work_dir=tmp_path))
    assert net.fitted == [("init_min_clients", 3, 2)]
    fitted = load_state_file(net.state_path)
    assert fitted.config.init_min_clients == 2 and net.state_path.parent == tmp_path
    assert load_state_file(TESTNET / "state.toml").config.init_min_clients == 3  # untouched
    # Three clients need nothing fitted: the config is used as it is.
    as_is = Testnet(TestnetOptions(num_clients=3, config_path=TESTNET, work_dir=tmp_path / "3"))
    assert as_is.fitted == [] and as_is.state_path == TESTNET / "state.toml"


def test_headless_run_that_cannot_start_times_out_and_stops_everything(tmp_path: Path) -> None:
    # The config names a model no client can load: the run never trains.
    config = tmp_path / "config"
    config.mkdir()
    state = (TESTNET / "state.toml").read_text().replace(
        'repo_id = "assets/tiny-llama"', 'repo_id = "/nonexistent/model"')
    assert "/nonexistent/model" in state
    (config / "state.toml").write_text(state)
    (config / "data.toml").write_text((TESTNET / "data.toml").read_text().replace(
        'dir = "../../assets', f'dir = "{ROOT}/assets'))
    server_port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "local_testnet", "--num-clients", "1",
         "--config-path", str(config), "--headless", "--work-dir", str(tmp_path / "work"),
         "--server-port", str(server_port), "--data-port", str(free_port()),
         "--timeout", "12"],
        cwd=ROOT, capture_output=True, check=False, text=True, timeout=180)
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["error"] == "timeout after 12 s" and summary["finished"] is False
    assert summary["steps"] == 0 and summary["clients_identical"] is False
    assert (tmp_path / "work" / "client-1.log").exists()
    server_log = (tmp_path / "work" / "server.log").read_text()
    if "listening" in server_log:  # on a very busy machine it may not have got that far
        assert "stopping" in server_log  # it was stopped with SIGTERM, cleanly
    with socket.socket() as sock:  # and it is gone: nothing listens on its port any more
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", server_port))


async def test_a_client_that_cannot_start_ends_the_run_at_once_naming_it(
        tmp_path: Path) -> None:
    # Client 2's metrics port is taken after the testnet picked its ports (what a CI run once
    # saw): the client exits 1 at start, and the run says so within seconds, not at its
    # timeout with the other client waiting for a second member.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_port()))
        holder.listen()
        taken = holder.getsockname()[1]
        testnet = Testnet(TestnetOptions(
            num_clients=2, config_path=TESTNET, work_dir=tmp_path, server_port=free_port(),
            client_args_of={2: ["--metrics-local-port", str(taken)]}, timeout_s=150))
        began = time.monotonic()
        summary = await run_headless(testnet)
    assert time.monotonic() - began < 60
    assert summary["error"].startswith("client-2 exited with code 1: error: ")
    assert f"--metrics-local-port {taken}" in summary["error"]
    assert summary["steps"] == 0 and summary["finished"] is False

    result = subprocess.run(
        [sys.executable, "-m", "bench.e2e", "--counts", "2", "--duration", "1",
         "--skip-round-overhead"],
        cwd=ROOT, capture_output=True, check=False, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["max_clients_p99_100ms"] in (0, 2)
    row = figures["broadcast_latency"][0]
    assert row["clients"] == 2 and row["samples"] > 0 and 0 < row["p50_ms"] < 5000
