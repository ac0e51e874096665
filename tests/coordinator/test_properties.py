"""Hypothesis properties over random configs and event sequences, and a whole run."""

from __future__ import annotations

import pytest
from coordinator_sim import VirtualRun, node, state_file
from hypothesis import given
from hypothesis import strategies as st

from coordinator import (
    MAX_CLIENTS,
    ClientState,
    CommitteeSelection,
    Coordinator,
    RunState,
    StateDecodeError,
    assign_data_for_state,
    decode_state,
    earned_points,
    encode_state,
    set_future_rates,
)
from coordinator.data_assignment import round_batch_size


@given(n=st.integers(1, 256), seed=st.integers(0, 2**64 - 1), witness_nodes=st.integers(0, 32))
def test_witness_set_has_the_configured_size(n: int, seed: int, witness_nodes: int) -> None:
    witness_nodes = min(witness_nodes, n)
    selection = CommitteeSelection(n=n, seed=seed, witness_nodes=witness_nodes)
    expected = witness_nodes if witness_nodes else min(n, 32)
    assert len(selection.witness_indices()) == expected


configs = st.fixed_dictionaries({
    "min_clients": st.integers(1, 6),
    "witness_nodes": st.integers(0, 3),
    "global_batch_size_start": st.integers(1, 20),
    "global_batch_size_end": st.integers(20, 64),
    "global_batch_size_warmup_tokens": st.integers(0, 40_000),
    "epoch_time": st.integers(20, 80),
    "total_steps": st.integers(2, 30),
})
actions = st.lists(st.tuples(st.sampled_from(["tick", "join", "drop", "pause", "resume"]),
                             st.integers(0, 40)), min_size=1, max_size=120)


def build(config: dict[str, int]) -> Coordinator:
    config = dict(config)
    config["witness_nodes"] = min(config["witness_nodes"], config["min_clients"])
    return Coordinator.from_state_file(state_file(
        init_min_clients=config["min_clients"], warmup_time=5, max_round_train_time=4,
        round_witness_time=1, cooldown_time=2, **config))


def play(coordinator: Coordinator, script: list[tuple[str, int]]) -> list[bytes]:
    run = VirtualRun(coordinator, clients=coordinator.state.config.init_min_clients + 1)
    snapshots = []
    for action, value in script:
        if action == "join" and len(run.alive) < 300:
            run.add(1000 + value)
        elif action == "drop" and run.alive:
            run.drop(run.alive[value % len(run.alive)])
        elif action == "pause":
            coordinator.pause(run.now)
        elif action == "resume":
            coordinator.resume(run.now)
        for _ in range(1 + value % 4):
            previous_step = coordinator.state.progress.step
            run.step()
            check_invariants(coordinator, previous_step)
        snapshots.append(encode_state(coordinator.state))
    return snapshots


def check_invariants(coordinator: Coordinator, previous_step: int) -> None:
    state = coordinator.state
    assert state.progress.step >= previous_step
    assert len(state.epoch_state.clients) <= MAX_CLIENTS
    assert len(state.epoch_state.exited_clients) <= MAX_CLIENTS
    if state.run_state is RunState.RoundTrain:
        assignment = assign_data_for_state(state)
        batches = sorted(assignment)
        total = round_batch_size(state.config, state.model.max_seq_len, state.current_round)
        # every index of the round assigned exactly once: contiguous, non-overlapping ranges
        start = state.current_round.data_index
        for batch in batches:
            assert batch.start == start and batch.end >= batch.start
            start = batch.end + 1
        assert start - state.current_round.data_index == total


@given(config=configs, script=actions)
def test_random_runs_keep_invariants_and_are_deterministic(
        config: dict[str, int], script: list[tuple[str, int]]) -> None:
    first = play(build(config), script)
    second = play(build(config), script)
    assert first == second  # two independent instances, same inputs -> same bytes
    for snapshot in first[-3:]:
        assert encode_state(decode_state(snapshot)) == snapshot


@given(config=configs, script=actions, cut=st.integers(0, 10_000), flip=st.integers(0, 255))
def test_serialization_round_trip_and_corruption(
        config: dict[str, int], script: list[tuple[str, int]], cut: int, flip: int) -> None:
    coordinator = build(config)
    blob = play(coordinator, script[:20])[-1]
    assert decode_state(blob) == coordinator.state
    with pytest.raises(StateDecodeError):
        decode_state(blob[: cut % len(blob)])
    corrupted = bytearray(blob)
    corrupted[cut % len(blob)] ^= flip or 1
    try:  # a flipped byte either decodes to some state or fails with a clear error
        decode_state(bytes(corrupted))
    except StateDecodeError as exc:
        assert str(exc)


def test_decode_rejects_garbage() -> None:
    with pytest.raises(StateDecodeError, match="bad magic"):
        decode_state(b"nope")
    blob = encode_state(build({"min_clients": 2, "witness_nodes": 1, "global_batch_size_start": 4,
                               "global_batch_size_end": 32, "global_batch_size_warmup_tokens": 0,
                               "epoch_time": 30, "total_steps": 9}).state)
    with pytest.raises(StateDecodeError, match="unsupported version 9"):
        decode_state(blob[:4] + b"\x09\x00" + blob[6:])
    with pytest.raises(StateDecodeError, match="trailing bytes"):
        decode_state(blob + b"\0")


def test_whole_run_with_joins_drops_pause_resume_ends_finished() -> None:
    coordinator = Coordinator.from_state_file(state_file(
        min_clients=3, init_min_clients=3, witness_nodes=2, warmup_time=8, max_round_train_time=4,
        round_witness_time=1, epoch_time=20, cooldown_time=2, total_steps=100,
        global_batch_size_start=8, global_batch_size_end=32,
        global_batch_size_warmup_tokens=20 * 512))
    set_future_rates(coordinator.state.rewards, earning_rate_total_shared=1200)
    run = VirtualRun(coordinator, clients=5)
    state = coordinator.state
    run.run_until(lambda s: s.progress.epoch == 1)
    assert state.progress.step > 5
    run.add(10)
    run.add(11)  # joiners wait for the next epoch
    run.run_until(lambda s: s.run_state is RunState.RoundTrain and s.progress.epoch == 1)
    assert node(10) in [c.id for c in state.epoch_state.clients]
    dropped = state.epoch_state.clients[0].id
    run.drop(dropped)
    run.run_until(lambda s: dropped in [c.id for c in s.epoch_state.exited_clients])
    assert coordinator.pause(run.now) is None and state.pending_pause
    run.run_until(lambda s: s.run_state is RunState.Paused)
    assert state.epoch_state.cold_start_epoch
    paused_step = state.progress.step
    for _ in range(5):
        run.step()
    assert state.progress.step == paused_step  # halted: nothing moves
    assert coordinator.resume(run.now) is None
    run.run_until(lambda s: s.run_state is RunState.Finished)
    assert state.progress.step >= state.config.total_steps and state.progress.epoch >= 3
    assert all(b <= a for a, b in zip(run.steps_seen[1:], run.steps_seen, strict=False))
    assert earned_points(state.rewards, node(1)) > 0
    assert all(c.state is not ClientState.Healthy for c in state.epoch_state.exited_clients)
