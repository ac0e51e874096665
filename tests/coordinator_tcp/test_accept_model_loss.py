"""A TCP run whose model is lost waits for a holder (model_lost, sent to its clients);
psyche-coordinator run --accept-model-loss: its operator restarts the server on the saved
state and the run goes on from the stored checkpoint, counted as a model reset; refused in
one line when there is nothing to accept it on."""

from __future__ import annotations

from pathlib import Path

import pytest
from tcp_helpers import (
    TESTNET,
    Clock,
    identity,
    join,
    make_state_file,
    next_state,
    server_options,
    wait_for,
)
from typer.testing import CliRunner

from coordinator import Client, Coordinator, NodeIdentity, RunState, decode_state, encode_state
from coordinator.config import ConfigError, HubCheckpoint, P2PCheckpoint
from coordinator_tcp.cli import app
from coordinator_tcp.persistence import StateStore
from coordinator_tcp.runner import RunOptions, load_run
from coordinator_tcp.server import CoordinatorServer


def save_a_lost_run(directory: Path) -> None:
    """The saved state of a run whose last epoch trained (model_ahead, P2P) and whose
    pending clients are all newcomers: it waits with model_lost."""
    coordinator = Coordinator.from_state_file(make_state_file(init_min_clients=2))
    state = coordinator.state
    state.model = state.model.model_copy(update={
        "checkpoint": P2PCheckpoint(repo_id="assets/tiny-llama")})
    state.model_ahead = True
    coordinator.tick([NodeIdentity(bytes([i]) * 32) for i in (7, 8)], 100, 1)
    assert state.run_state is RunState.WaitingForMembers and state.model_lost
    StateStore(directory).save(encode_state(state), {})


def options(tmp_path: Path, saved: Path, accept: bool) -> RunOptions:
    state_toml = tmp_path / "state.toml"
    state_toml.write_text(make_state_file(init_min_clients=2).to_toml())
    return RunOptions(state_path=state_toml, data_config_path=TESTNET / "data.toml",
                      server=server_options(save_state_dir=saved), accept_model_loss=accept)


def test_a_restart_with_the_flag_goes_on_from_the_stored_checkpoint(tmp_path: Path) -> None:
    save_a_lost_run(tmp_path / "saved")
    waiting = load_run(options(tmp_path, tmp_path / "saved", accept=False)).coordinator.state
    assert waiting.model_lost and isinstance(waiting.model.checkpoint, P2PCheckpoint)
    state = load_run(options(tmp_path, tmp_path / "saved", accept=True)).coordinator.state
    assert not state.model_lost and state.model_resets == 1
    assert state.model.checkpoint == HubCheckpoint(repo_id="assets/tiny-llama")
    # Accepted once: a second restart with the flag has nothing left to accept.
    StateStore(tmp_path / "saved").save(encode_state(state), {})
    with pytest.raises(ConfigError, match="--accept-model-loss: the stored checkpoint is as "
                                          "new as the clients' model"):
        load_run(options(tmp_path, tmp_path / "saved", accept=True))


def test_the_flag_without_a_saved_state_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "run", "--state", str(TESTNET / "state.toml"), "--data-config",
        str(TESTNET / "data.toml"), "--server-port", "0", "--accept-model-loss"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert any("--accept-model-loss: no saved state to accept it on" in line for line in lines)
    assert "Traceback" not in result.output


async def test_a_tcp_run_waits_for_a_holder_and_tells_its_clients() -> None:
    """Over real loopback connections: a newcomer alone makes the run wait (the state it
    is sent says model_lost), the last epoch's client coming back starts the warm-up from
    it (P2P, holds_model)."""
    coordinator = Coordinator.from_state_file(make_state_file(init_min_clients=1))
    state = coordinator.state
    assert state.run_state is RunState.WaitingForMembers
    state.model = state.model.model_copy(update={
        "checkpoint": P2PCheckpoint(repo_id="assets/tiny-llama")})
    state.model_ahead = True
    holder = NodeIdentity(identity(1).public_key)
    state.epoch_state.clients = [Client(holder)]
    clock = Clock(2_000_000.0)
    server = CoordinatorServer(coordinator, server_options(), clock=clock)
    await server.start()
    newcomer = await join(server, identity(2))
    try:
        clock.now += 2
        await wait_for(lambda: server.state.model_lost)
        assert server.state.run_state is RunState.WaitingForMembers
        sent = decode_state((await next_state(newcomer)).state_bytes)
        for _ in range(20):
            if sent.model_lost:
                break
            sent = decode_state((await next_state(newcomer)).state_bytes)
        assert sent.model_lost
        back = await join(server, identity(1))
        await wait_for(lambda: server.state.run_state is RunState.Warmup)
        assert not server.state.model_lost and server.state.model_resets == 0
        assert isinstance(server.state.model.checkpoint, P2PCheckpoint)
        assert {c.id: c.holds_model for c in server.state.epoch_state.clients} == {
            holder: True, NodeIdentity(identity(2).public_key): False}
        await back.close()
    finally:
        await newcomer.close()
        await server.stop()
