"""`psyche-coordinator run` as a real process: validates, serves, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from loopback import free_port
from tcp_helpers import RUN_ID, TESTNET, identity, next_state

from client_image.data import DataProviderError
from client_image.data.tcp_provider import TcpDataProvider
from coordinator import RunState, decode_state
from coordinator_tcp.client import ProtocolConnection
from psyche_common.tcp.connection import Connection


def write_config(tmp_path: Path, data_port: int) -> tuple[Path, Path]:
    state = (TESTNET / "state.toml").read_text().replace(
        "127.0.0.1:20001", f"127.0.0.1:{data_port}").replace(
        "init_min_clients = 3", "init_min_clients = 1")
    (tmp_path / "state.toml").write_text(state)
    data = (TESTNET / "data.toml").read_text().replace(
        "../../assets/data/train", str(TESTNET.parents[1] / "assets" / "data" / "train"))
    (tmp_path / "data.toml").write_text(data)
    return tmp_path / "state.toml", tmp_path / "data.toml"


def coordinator(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "coordinator_tcp", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def connect_with_retry(port: int) -> Connection:
    for _ in range(150):
        try:
            connection, _ = await ProtocolConnection.connect(
                "127.0.0.1", port, identity(1), RUN_ID, "addr", timeout_s=2)
            return connection
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError("the coordinator never listened")


async def test_run_serves_coordinator_and_data_then_stops_on_sigterm(tmp_path: Path) -> None:
    server_port, data_port = free_port(), free_port()
    state, data = write_config(tmp_path, data_port)
    process = coordinator("run", "--state", str(state), "--data-config", str(data),
                          "--server-port", str(server_port), "--bind-host", "127.0.0.1",
                          "--save-state-dir", str(tmp_path / "saved"),
                          "--tick-interval", "0.1", "--init-warmup-time", "5")
    try:
        client = await connect_with_retry(server_port)
        update = await next_state(client)
        assert decode_state(update.state_bytes).run_state is RunState.WaitingForMembers
        # The client joined: the epoch starts and the data server admits it.
        for _ in range(100):
            update = await next_state(client)
            if decode_state(update.state_bytes).run_state is RunState.Warmup:
                break
        warm = decode_state(update.state_bytes)
        assert warm.run_state is RunState.Warmup and warm.config.warmup_time == 5
        provider = await TcpDataProvider.open(f"127.0.0.1:{data_port}", identity(1), RUN_ID,
                                              128, retry_delay_s=0.05)
        batch = await provider.fetch(0, 2)
        assert batch.shape == (3, 128) and batch.dtype == torch.int64
        await provider.aclose()
        outsider = await TcpDataProvider.open(f"127.0.0.1:{data_port}", identity(7), RUN_ID,
                                              128, attempts=1)
        with pytest.raises(DataProviderError, match="NotInThisRound"):
            await outsider.fetch(0, 0)
        await outsider.aclose()
        await client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, stderr = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert process.returncode == 0, stderr
    assert "listening" in stderr and "stopping" in stderr
    assert (tmp_path / "saved" / "state.bin").exists()


def test_run_refuses_a_bad_config_with_validate_config_messages(tmp_path: Path) -> None:
    bad = TESTNET.parents[1] / "tests" / "coordinator" / "fixtures" / "bad_state.toml"
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "coordinator_tcp", "run", "--state", str(bad),
                             "--server-port", str(free_port())],
                            capture_output=True, check=False, text=True, timeout=60)
    assert result.returncode == 1
    assert "config.init_min_clients: must be >= config.min_clients (2), got 1" in result.stderr
    assert time.monotonic() - started < 60
    # A Server data location without --data-config is an error naming the fix.
    state, _ = write_config(tmp_path, free_port())
    result = subprocess.run([sys.executable, "-m", "coordinator_tcp", "run", "--state",
                             str(state), "--server-port", str(free_port())],
                            capture_output=True, check=False, text=True, timeout=60)
    assert result.returncode == 1 and "pass --data-config data.toml" in result.stderr
    result = subprocess.run([sys.executable, "-m", "coordinator_tcp", "run", "--state",
                             str(state), "--tui", "maybe"],
                            capture_output=True, check=False, text=True, timeout=60)
    assert result.returncode != 0 and "unexpected extra argument(s) (maybe)" in result.stderr
