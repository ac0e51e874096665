"""--save-state-dir: every change saved atomically; a restarted server resumes the run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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

from coordinator import (
    Coordinator,
    RunState,
    Witness,
    WitnessProof,
    decode_state,
    encode_state,
    selection_for_round,
)
from coordinator.config import ConfigError, P2PCheckpoint
from coordinator_tcp.persistence import PersistenceError, StateStore, unseal
from coordinator_tcp.protocol import WarmupWitness, WitnessModel, WitnessSubmit
from coordinator_tcp.runner import RunOptions, load_run
from coordinator_tcp.server import CoordinatorServer


async def test_restart_resumes_step_epoch_and_clients(tmp_path: Path) -> None:
    clock = Clock(2_000_000.0)
    options = server_options(save_state_dir=tmp_path / "saved", reconnect_grace_s=30)
    first = CoordinatorServer(Coordinator.from_state_file(make_state_file()), options,
                              clock=clock)
    await first.start()
    client = await join(first, identity(1), address="addr-1")
    clock.now += 2
    await wait_for(lambda: first.state.run_state is RunState.Warmup)
    await client.send(WarmupWitness(witness=WitnessModel.of(
        Witness(WitnessProof(position=0, index=0, witness=False)))))
    await wait_for(lambda: first.state.run_state is RunState.RoundTrain)
    clock.now += 3  # RoundTrain times out -> RoundWitness; then the step advances
    await wait_for(lambda: first.state.run_state is RunState.RoundWitness)
    before = encode_state(first.state)
    await first.stop()  # the server process dies; the client's connection with it
    await client.close()

    # Restart exactly as `psyche-coordinator run` does.
    state_toml = tmp_path / "state.toml"
    state_toml.write_text(make_state_file().to_toml())
    loaded = load_run(RunOptions(state_path=state_toml,
                                 data_config_path=TESTNET / "data.toml", server=options))
    assert loaded.resumed and loaded.p2p_addresses == {identity(1).node_id: "addr-1"}
    assert encode_state(loaded.coordinator.state) == before
    second = CoordinatorServer(loaded.coordinator, options, clock=clock,
                               p2p_addresses=loaded.p2p_addresses, resumed=True)
    await second.start()
    state = second.state
    assert state.run_state is RunState.RoundWitness
    assert (state.progress.epoch, state.progress.step) == (0, 1)
    assert [c.id.key for c in state.epoch_state.clients] == [identity(1).public_key]
    # Until its listed client is back the run holds, however long the phase has run.
    clock.now += 10
    await asyncio.sleep(0.3)
    assert second.resuming and second.state.run_state is RunState.RoundWitness
    # The client reconnects within the grace period: it stays a Healthy member, and the
    # interrupted phase starts its timer afresh (the outage did not use it up).
    client = await join(second, identity(1), address="addr-1")
    update = decode_state((await next_state(client)).state_bytes)
    assert update.epoch_state.clients[0].state.name == "Healthy"
    await wait_for(lambda: not second.resuming)
    assert second.state.run_state_start_unix_timestamp == int(clock.now)
    # It witnesses the round (it is the only witness), so the run moves to step 2 and
    # the grace deadline passes without withdrawing it.
    proof = selection_for_round(second.state).witness_of(0)
    await client.send(WitnessSubmit(witness=WitnessModel.of(Witness(proof))))
    await wait_for(lambda: len(second.state.current_round.witnesses) == 1)
    clock.now += 31
    await wait_for(lambda: second.state.progress.step == 2)
    assert second.state.run_state is RunState.RoundTrain
    assert second.state.epoch_state.clients[0].state.name == "Healthy"
    await second.stop()
    await client.close()


async def test_clients_that_do_not_come_back_are_withdrawn(tmp_path: Path) -> None:
    clock = Clock(2_000_000.0)
    options = server_options(save_state_dir=tmp_path, reconnect_grace_s=5)
    first = CoordinatorServer(Coordinator.from_state_file(make_state_file()), options,
                              clock=clock)
    await first.start()
    client = await join(first, identity(1))
    clock.now += 2
    await wait_for(lambda: first.state.run_state is RunState.Warmup)
    await first.stop()
    await client.close()
    saved = StateStore(tmp_path).load()
    assert saved is not None
    second = CoordinatorServer(Coordinator(saved[0]), options, clock=clock, resumed=True)
    await second.start()
    assert second.state.epoch_state.clients[0].state.name == "Healthy"
    clock.now += 6
    # Past the grace period the absent client is withdrawn.
    def states() -> list[str]:
        epoch = second.state.epoch_state
        return [c.state.name for c in [*epoch.clients, *epoch.exited_clients]]

    await wait_for(lambda: states() == ["Withdrawn"])
    await second.stop()


def test_store_is_atomic_and_rejects_garbage(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    state = Coordinator.from_state_file(make_state_file()).state
    assert store.save(encode_state(state), {"ab": "x"})
    assert not store.save(encode_state(state), {"ab": "x"})  # unchanged: not rewritten
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["p2p_addresses.json", "state.bin"]
    loaded = StateStore(tmp_path).load()
    assert loaded is not None and encode_state(loaded[0]) == encode_state(state)
    sealed = (tmp_path / "state.bin").read_bytes()
    assert decode_state(unseal(sealed, tmp_path / "state.bin")).run_id == state.run_id
    (tmp_path / "state.bin").write_bytes(b"garbage")
    with pytest.raises(PersistenceError, match=r"state\.bin"):
        StateStore(tmp_path).load()
    with pytest.raises(ConfigError, match="--save-state-dir"):
        load_run(RunOptions(state_path=TESTNET / "state.toml",
                            data_config_path=TESTNET / "data.toml",
                            server=server_options(save_state_dir=tmp_path)))


def saved_twice(directory: Path) -> tuple[bytes, bytes]:
    """A store that saved two states: (the current file's bytes, the previous state)."""
    store = StateStore(directory)
    coordinator = Coordinator.from_state_file(make_state_file())
    first = encode_state(coordinator.state)
    store.save(first, {})
    coordinator.state.progress.step = 7
    store.save(encode_state(coordinator.state), {})
    return (directory / "state.bin").read_bytes(), first


def flip_bit(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x10]) + data[index + 1:]


@pytest.mark.parametrize(("corrupt", "message"), [
    (lambda data: data[: len(data) // 2], "checksum mismatch, the file is corrupt"),
    (lambda data: data[:5], r"truncated \(5 bytes\)"),
    (lambda data: flip_bit(data, len(data) - 3), "checksum mismatch"),
    (lambda data: flip_bit(data, 60), "checksum mismatch"),
    (lambda data: flip_bit(data, 20), "checksum mismatch"),  # the stored digest itself
    (lambda data: data[:8] + bytes([9]) + data[9:], "saved in format 9, this server reads format 1"),
    (lambda data: b"\x00" * len(data), "not a saved coordinator state"),
], ids=["truncated", "header-only", "bit-flip-end", "bit-flip-middle", "bit-flip-digest",
        "wrong-version", "zeroed"])
def test_a_corrupt_state_file_is_refused_and_the_previous_one_named(
        tmp_path: Path, corrupt: Callable[[bytes], bytes], message: str) -> None:
    current, previous = saved_twice(tmp_path)
    (tmp_path / "state.bin").write_bytes(corrupt(current))
    with pytest.raises(PersistenceError, match=message) as refused:
        StateStore(tmp_path).load()
    assert "state.prev.bin" in str(refused.value)  # the previous good state, named
    assert unseal((tmp_path / "state.prev.bin").read_bytes(), tmp_path) == previous
    # Refusing changes nothing on disk; resuming from the previous state works.
    assert (tmp_path / "state.bin").read_bytes() == corrupt(current)
    (tmp_path / "state.prev.bin").replace(tmp_path / "state.bin")
    loaded = StateStore(tmp_path).load()
    assert loaded is not None and encode_state(loaded[0]) == previous


def run_options(directory: Path) -> RunOptions:
    return RunOptions(state_path=TESTNET / "state.toml", data_config_path=TESTNET / "data.toml",
                      server=server_options(save_state_dir=directory))


def test_a_missing_state_beside_a_previous_one_is_refused_and_nothing_is_overwritten(
        tmp_path: Path) -> None:
    """state.bin deleted, state.prev.bin left: starting a new run there would overwrite the
    last good state with the new run's second save. Refused in one line naming both."""
    _, previous = saved_twice(tmp_path)
    (tmp_path / "state.bin").unlink()
    kept = (tmp_path / "state.prev.bin").read_bytes()
    with pytest.raises(ConfigError) as refused:
        load_run(run_options(tmp_path))
    message = str(refused.value)
    assert "\n" not in message.strip()
    assert f"{tmp_path / 'state.bin'} is missing" in message
    assert f"intact in {tmp_path / 'state.prev.bin'}" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p2p_addresses.json",
                                                          "state.prev.bin"]
    assert (tmp_path / "state.prev.bin").read_bytes() == kept
    # Doing what the message says resumes the previous state.
    (tmp_path / "state.prev.bin").replace(tmp_path / "state.bin")
    assert load_run(run_options(tmp_path)).resumed
    loaded = StateStore(tmp_path).load()
    assert loaded is not None and encode_state(loaded[0]) == previous


def test_a_dangling_state_link_is_refused(tmp_path: Path) -> None:
    """A state.bin linking to a volume that is not mounted: not a new run."""
    (tmp_path / "state.bin").symlink_to(tmp_path / "unmounted" / "state.bin")
    with pytest.raises(PersistenceError, match=r"state\.bin is a link to .*unmounted.*which "
                                               r"does not exist$"):
        StateStore(tmp_path).load()
    _, previous = saved_twice(tmp_path / "with-previous")
    (tmp_path / "with-previous" / "state.bin").unlink()
    (tmp_path / "with-previous" / "state.bin").symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match=r"does not exist; the state before it is intact in "
                                          r".*state\.prev\.bin"):
        load_run(run_options(tmp_path / "with-previous"))
    assert (tmp_path / "with-previous" / "state.bin").is_symlink()  # left as it was
    assert unseal((tmp_path / "with-previous" / "state.prev.bin").read_bytes(),
                  tmp_path) == previous


def test_a_missing_state_beside_an_unusable_previous_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state.prev.bin").write_bytes(b"garbage")
    with pytest.raises(PersistenceError, match=r"state\.bin is missing and .*state\.prev\.bin "
                                               r"is no usable state either"):
        StateStore(tmp_path).load()
    # A directory that never held a state (only the address map) starts a new run.
    (tmp_path / "state.prev.bin").unlink()
    (tmp_path / "p2p_addresses.json").write_text("{}")
    assert StateStore(tmp_path).load() is None


def test_a_state_dir_that_is_a_file_or_a_state_that_is_a_directory_is_refused(
        tmp_path: Path) -> None:
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    with pytest.raises(PersistenceError, match="is a file, not a directory"):
        StateStore(a_file)
    (tmp_path / "saved" / "state.bin").mkdir(parents=True)
    with pytest.raises(PersistenceError, match=r"state\.bin is not a file"):
        StateStore(tmp_path / "saved").load()
    for directory, message in ((a_file, "is a file, not a directory"),
                               (tmp_path / "saved", "is not a file")):
        with pytest.raises(ConfigError, match=f"--save-state-dir: .*{message}"):
            load_run(RunOptions(state_path=TESTNET / "state.toml",
                                data_config_path=TESTNET / "data.toml",
                                server=server_options(save_state_dir=directory)))


def test_saved_state_of_another_run_is_refused(tmp_path: Path) -> None:
    other = Coordinator.from_state_file(make_state_file()).state
    other.run_id = "another-run"
    StateStore(tmp_path).save(encode_state(other), {})
    with pytest.raises(ConfigError, match="holds run 'another-run'"):
        load_run(RunOptions(state_path=TESTNET / "state.toml",
                            data_config_path=TESTNET / "data.toml",
                            server=server_options(save_state_dir=tmp_path)))


def test_a_resume_takes_the_checkpoint_location_from_the_state_file(tmp_path: Path) -> None:
    """The location is the authority's (clients only report revisions of it): restarting
    with an edited state.toml moves it; the saved P2P tag (clients hold the model) stays,
    and an unchanged location keeps the saved revision."""
    saved = Coordinator.from_state_file(make_state_file()).state
    saved.model = saved.model.model_copy(update={"checkpoint": P2PCheckpoint(
        repo_id="assets/tiny-llama", revision="rev-7")})
    StateStore(tmp_path / "saved").save(encode_state(saved), {})
    options = server_options(save_state_dir=tmp_path / "saved")

    def resume_with(repo_id: str) -> object:
        state_toml = tmp_path / "state.toml"
        state = make_state_file(model={"checkpoint": {"Hub": {"repo_id": repo_id}}})
        state_toml.write_text(state.to_toml())
        loaded = load_run(RunOptions(state_path=state_toml,
                                     data_config_path=TESTNET / "data.toml", server=options))
        assert loaded.resumed
        return loaded.coordinator.state.model.checkpoint

    assert resume_with("assets/tiny-llama") == saved.model.checkpoint
    moved = resume_with("org/new-home")
    assert isinstance(moved, P2PCheckpoint) and moved.repo_id == "org/new-home"


async def test_init_warmup_time_applies_until_active_and_never_sticks(tmp_path: Path) -> None:
    clock = Clock(2_000_000.0)
    options = server_options(save_state_dir=tmp_path / "saved", init_warmup_time=7)
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file()), options,
                               clock=clock)
    await server.start()
    client = await join(server, identity(1))
    try:
        assert server.state.config.warmup_time == 7
        clock.now += 2
        await wait_for(lambda: server.state.run_state is RunState.Warmup)
        clock.now += 3  # past the configured 2 s but within the initial 7 s: still warming up
        await asyncio.sleep(0.2)
        assert server.state.run_state is RunState.Warmup
        state_toml = tmp_path / "state.toml"
        state_toml.write_text(make_state_file().to_toml())
        resumed = load_run(RunOptions(state_path=state_toml, server=options,
                                      data_config_path=TESTNET / "data.toml"))
        assert resumed.coordinator.state.config.warmup_time == 2  # from the state file
        clock.now += 5
        await wait_for(lambda: server.state.run_state is RunState.RoundTrain)
        assert server.state.config.warmup_time == 2  # active: back to the configured value
    finally:
        await server.stop()
        await client.close()
