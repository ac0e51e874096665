"""Runs that lose a part: a client SIGKILLed mid-round, the coordinator killed in each
phase and restarted from its state directory, and a client that joins late and must get
the model from its peers."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest
from e2e_helpers import (
    REPO,
    checkpoint_digests,
    events,
    log_tails,
    make_testnet,
    wait_for,
)

from coordinator import ClientState, CoordinatorState, RunState
from local_testnet.audit import checkpoints_equal_initial, hub_fallback_epochs
from local_testnet.testnet import Testnet, client_key, run_headless

pytestmark = pytest.mark.slow
INITIAL_MODEL = REPO / "assets" / "tiny-llama" / "model.safetensors"


def _state_of(state: CoordinatorState, key: bytes) -> ClientState | None:
    for client in [*state.epoch_state.clients, *state.epoch_state.exited_clients]:
        if client.id.key == key:
            return client.state
    return None


async def test_sigkilled_client_is_dropped_by_health_checks_and_the_run_goes_on(tmp_path) -> None:
    # Every client witnesses (witness_nodes = 0), so a dead one cannot stall the round
    # alone; the server keeps disconnected clients listed, so only a health check removes it.
    testnet = make_testnet(
        tmp_path, 3, server_args=["--withdraw-on-disconnect", "false"],
        config={"total_steps": 60, "epoch_time": 200, "witness_nodes": 0, "min_clients": 2})
    victim = client_key(3)
    try:
        await testnet.start()
        await wait_for(testnet, lambda s: s.run_state is RunState.RoundTrain
                       and s.current_round.height >= 3, 180, "training round 3")
        process = testnet.clients[3].process
        assert process is not None
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        dropped = await wait_for(testnet, lambda s: _state_of(s, victim) is ClientState.Dropped,
                                 120, "a health check dropping the killed client")
        after = dropped.progress.step
        later = await wait_for(testnet, lambda s: s.progress.step >= after + 3
                               and s.run_state is RunState.RoundTrain, 120,
                               "three more steps without the killed client")
    finally:
        await testnet.stop()
    assert later.run_state in (RunState.RoundTrain, RunState.RoundWitness, RunState.Cooldown)
    assert all(c.id.key != victim for c in later.epoch_state.clients)
    health_checks = [e for i in (1, 2) for e in events(testnet.options.work_dir, i, "health_check")]
    assert any(victim.hex()[:12] in e["unhealthy"] for e in health_checks), health_checks
    # Its share of the data goes to the survivors: once it is gone, their batches of a
    # step cover the whole global batch.
    work = testnet.options.work_dir
    trained = [e for i in (1, 2) for e in events(work, i, "trained") if e["step"] == later.progress.step - 1]
    assert sum(end - start + 1 for start, end in (e["batch"] for e in trained)) == 12, trained


PHASES_TO_KILL_IN = [RunState.Warmup, RunState.RoundTrain, RunState.RoundWitness,
                     RunState.Cooldown, RunState.WaitingForMembers]


def kill_server_in(testnet: Testnet, phase: RunState) -> asyncio.Future[CoordinatorState]:
    """SIGKILL the coordinator the moment the observer sees `phase` after epoch 0 (polling
    would miss a warm-up that ends in a blink); resolves to the state it was killed in."""
    killed: asyncio.Future[CoordinatorState] = asyncio.get_running_loop().create_future()

    def listener(state: CoordinatorState) -> None:
        server = testnet.server
        if killed.done() or state.run_state is not phase or state.progress.epoch < 1 \
                or server is None:
            return
        os.killpg(server.pid, signal.SIGKILL)
        testnet.state_listeners.remove(listener)
        killed.set_result(state)

    testnet.state_listeners.append(listener)
    return killed


def newer_than(before: CoordinatorState) -> Callable[[CoordinatorState], bool]:
    return lambda state: state is not before and state.progress.step >= before.progress.step


async def test_coordinator_killed_in_every_phase_loses_no_step(tmp_path) -> None:
    """kill -9 of the coordinator once in each phase, restarted 6 s later (longer than a
    round may last) from its state dir: every step is still trained (none counted with
    its data skipped), every result of every step is applied by every client (none
    dropped by the step in flight when the coordinator died), nobody falls back to the
    initial model, the clients end identical. Without the restarted server's hold, a
    timed-out round with no witnesses withdraws everyone and the run restarts from the
    initial model; a witness the client replays after the restart was taken for the next
    round (its blooms vouching for the step before), and a batch fetch from the data server
    (in the coordinator's process) gave up while the server was down."""
    testnet = make_testnet(tmp_path, 2, config={"total_steps": 26, "epoch_time": 21,
                                                "warmup_time": 20, "init_min_clients": 2,
                                                "max_round_train_time": 5})
    restarts = []
    try:
        await testnet.start()
        for phase in PHASES_TO_KILL_IN:
            # Past the first epoch, so that every restart finds a model to lose.
            server = testnet.server
            assert server is not None
            before = await asyncio.wait_for(kill_server_in(testnet, phase), 240)
            await server.wait()
            # Down longer than a training round may last: the phase's timer must not run out
            # while its clients are still reconnecting.
            await asyncio.sleep(6)
            await testnet.start_server()  # same --save-state-dir: resumes the run
            resumed = await wait_for(testnet, newer_than(before), 60, "the restarted state")
            restarts.append((phase.name, before.progress.step, resumed.run_state.name))
        final = await wait_for(testnet, lambda s: s.run_state is RunState.Finished, 300,
                               "the run to finish after the restarts")
        clients = [c.process for c in testnet.clients.values() if c.process is not None]
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in clients)), 30)
    finally:
        await testnet.stop()
    assert final.progress.step == 26, restarts
    assert testnet.untrained_steps() == [], restarts
    work = testnet.options.work_dir
    applied = {i: events(work, i, "applied") for i in (1, 2)}
    dropped = [(i, e) for i in (1, 2) for e in applied[i] if e["skipped"] or e["left_out"]]
    assert dropped == [], (restarts, dropped, log_tails(work))
    # Both applied the same steps, each with both clients' results.
    assert [e["of_step"] for e in applied[1]] == [e["of_step"] for e in applied[2]], restarts
    assert all(e["results"] == 2 for i in (1, 2) for e in applied[i]), applied
    assert hub_fallback_epochs(work, 2) == [], restarts
    reset, examined = checkpoints_equal_initial(work, 2, INITIAL_MODEL)
    assert examined >= 2 and reset == 0, restarts
    digests = [checkpoint_digests(work, i) for i in (1, 2)]
    last = max(digests[0])
    assert digests[0][last] == digests[1][last]


async def test_late_joiner_gets_the_model_from_peers_and_ends_identical(tmp_path) -> None:
    testnet = make_testnet(tmp_path, 3, late_join_client_delay_s=12.0,
                           config={"total_steps": 26, "epoch_time": 25, "warmup_time": 20,
                                   "init_min_clients": 2, "min_clients": 2})
    summary = await run_headless(testnet)
    assert summary["error"] is None and summary["finished"], summary
    work = testnet.options.work_dir
    loaded = events(work, 3, "model_loaded")
    assert loaded and loaded[0]["source"] == "p2p", loaded
    assert events(work, 3, "trained"), "the late client never trained"
    digests = [checkpoint_digests(work, i) for i in (1, 2, 3)]
    last = max(digests[2])
    assert digests[0][last] == digests[1][last] == digests[2][last]
