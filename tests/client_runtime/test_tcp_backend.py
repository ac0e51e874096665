"""The client's TCP backend across a coordinator restart: nothing it says is lost."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from loopback import free_port
from tcp_helpers import RUN_ID, Clock, make_state_file, server_options, wait_for

from client_image.backends.base import ServerState
from client_image.backends.tcp import TcpBackend
from coordinator import (
    Bloom,
    Coordinator,
    CoordinatorState,
    RunState,
    Witness,
    WitnessProof,
    selection_for_round,
)
from coordinator.messages import Refusal, RoundWitness, WarmupWitness, WitnessMetadata
from coordinator_tcp.persistence import StateStore
from coordinator_tcp.server import CoordinatorServer
from psyche_common.identity import Identity

pytestmark = pytest.mark.timeout(60)


async def test_a_witness_sent_while_the_coordinator_restarts_reaches_the_new_one(
        tmp_path: Path) -> None:
    clock, port = Clock(2_000_000.0), free_port()
    options = server_options(port=port, save_state_dir=tmp_path, reconnect_grace_s=30)
    first = CoordinatorServer(Coordinator.from_state_file(make_state_file()), options,
                              clock=clock)
    await first.start()
    me = Identity(bytes(31) + b"\x09")
    backend = TcpBackend(f"127.0.0.1:{port}", me, RUN_ID, f"{me.node_id}@127.0.0.1:1",
                         max_backoff_s=0.3)
    phases: list[RunState] = []
    errors: list[Refusal] = []
    stop = asyncio.Event()

    async def on_state(server_state: ServerState) -> None:
        phases.append(server_state.state.run_state)

    task = asyncio.create_task(backend.run(on_state, errors.append, stop))
    second: CoordinatorServer | None = None
    try:
        await wait_for(lambda: phases)
        clock.now += 2
        await wait_for(lambda: phases[-1] is RunState.Warmup)
        await first.stop()  # the coordinator goes down
        await wait_for(lambda: not backend.connected.is_set())
        # The client is ready meanwhile: its warm-up witness must not be lost.
        witness = WarmupWitness(Witness(WitnessProof(position=0, index=0, witness=False)))
        sending = asyncio.create_task(backend.send_warmup_witness(witness))
        await asyncio.sleep(0.5)
        assert not sending.done()  # waiting for a connection, not dropped
        saved = StateStore(tmp_path).load()
        assert saved is not None
        second = CoordinatorServer(Coordinator(saved[0]), options, clock=clock, resumed=True)
        await second.start()
        assert await asyncio.wait_for(sending, 10)
        # The only client's warm-up witness starts the round on the restarted server.
        await wait_for(lambda: second is not None
                       and second.state.run_state is RunState.RoundTrain)
        assert not errors
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if second is not None:
            await second.stop()


async def test_a_witness_is_never_replayed_into_a_later_round(tmp_path: Path) -> None:
    """What was sent in the seconds before a connection dropped is sent again on the next
    one (the server may have died before reading it). A witness made for step s, replayed
    into a restarted coordinator already at step s+1, was taken as step s+1's witness when
    the same client is elected again: its blooms vouch for step s-1's results, so no
    result of step s reached a quorum and every client applied it with `results: 0`
    although all had trained it. A witness goes only to the step it was made for."""
    clock, port = Clock(2_000_000.0), free_port()
    options = server_options(port=port, save_state_dir=tmp_path, reconnect_grace_s=30)
    first = CoordinatorServer(Coordinator.from_state_file(make_state_file()), options,
                              clock=clock)
    await first.start()
    me = Identity(bytes(31) + b"\x09")
    backend = TcpBackend(f"127.0.0.1:{port}", me, RUN_ID, f"{me.node_id}@127.0.0.1:1",
                         max_backoff_s=0.3)
    states: list[CoordinatorState] = []
    errors: list[Refusal] = []
    stop = asyncio.Event()

    async def on_state(server_state: ServerState) -> None:
        states.append(server_state.state)

    def witness_of(state: CoordinatorState, mark: bytes) -> RoundWitness:
        """The only client's witness (it is elected every round), its bloom marked."""
        bloom = Bloom(keys=(1, 2, 3, 4, 5, 6, 7, 8))
        bloom.add(mark)
        return RoundWitness(
            witness=Witness(selection_for_round(state).witness_of(0), broadcast_bloom=bloom),
            metadata=WitnessMetadata(step=state.progress.step))

    task = asyncio.create_task(backend.run(on_state, errors.append, stop))
    second: CoordinatorServer | None = None
    try:
        await wait_for(lambda: states)
        clock.now += 2
        await wait_for(lambda: states[-1].run_state is RunState.Warmup)
        assert await backend.send_warmup_witness(WarmupWitness(
            Witness(WitnessProof(position=0, index=0, witness=False))))
        await wait_for(lambda: states[-1].run_state is RunState.RoundTrain)
        earlier = states[-1]
        step = earlier.progress.step
        assert await backend.send_witness(witness_of(earlier, b"vouches for the step before"))
        await wait_for(lambda: first.state.run_state is RunState.RoundWitness)
        clock.now += 2  # the witness time passes: the next round
        await wait_for(lambda: states[-1].progress.step == step + 1
                       and states[-1].run_state is RunState.RoundTrain)
        await first.stop()  # within the replay window of the witness
        await wait_for(lambda: not backend.connected.is_set())
        saved = StateStore(tmp_path).load()
        assert saved is not None
        second = CoordinatorServer(Coordinator(saved[0]), options, clock=clock, resumed=True)
        await second.start()
        await wait_for(backend.connected.is_set)
        await asyncio.sleep(0.5)  # whatever the backend replays has arrived by now
        assert second.state.progress.step == step + 1
        assert second.state.current_round.witnesses == []
        assert not errors
        # The round's own witness is taken, and the run goes on.
        fresh = witness_of(second.state, b"step s")
        assert await backend.send_witness(fresh)
        await wait_for(lambda: len(second.state.current_round.witnesses) == 1)
        assert second.state.current_round.witnesses[0].broadcast_bloom.contains(b"step s")
        # A witness of a step that is over is not sent at all (a late one, not a replay).
        assert not await backend.send_witness(witness_of(earlier, b"too late"))
        await asyncio.sleep(0.3)
        assert len(second.state.current_round.witnesses) == 1 and not errors
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if second is not None:
            await second.stop()
