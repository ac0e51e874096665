"""The client's TCP backend across a coordinator restart: nothing it says is lost."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
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
from coordinator_tcp.server import CoordinatorServer, ServerOptions
from psyche_common.identity import Identity

pytestmark = pytest.mark.timeout(60)


@dataclass
class RestartedRun:
    """A coordinator server saving its state, the one client's backend following it, and
    the second server that `restart` resumes from the first's saved state."""

    clock: Clock
    options: ServerOptions
    state_dir: Path
    first: CoordinatorServer
    backend: TcpBackend
    states: list[CoordinatorState] = field(default_factory=list)
    errors: list[Refusal] = field(default_factory=list)
    first_stopped: bool = False
    second: CoordinatorServer | None = None

    async def stop_first(self) -> None:
        """The coordinator goes down; the backend sees its connection drop."""
        await self.first.stop()
        self.first_stopped = True
        await wait_for(lambda: not self.backend.connected.is_set())

    async def restart(self) -> CoordinatorServer:
        """A new server resumed from what the first one saved, started."""
        saved = StateStore(self.state_dir).load()
        assert saved is not None
        self.second = CoordinatorServer(Coordinator(saved[0]), self.options, clock=self.clock,
                                        resumed=True)
        await self.second.start()
        return self.second


@pytest.fixture
async def run(tmp_path: Path) -> AsyncIterator[RestartedRun]:
    clock, port = Clock(2_000_000.0), free_port()
    options = server_options(port=port, save_state_dir=tmp_path, reconnect_grace_s=30)
    first = CoordinatorServer(Coordinator.from_state_file(make_state_file()), options,
                              clock=clock)
    await first.start()
    me = Identity(bytes(31) + b"\x09")
    backend = TcpBackend(f"127.0.0.1:{port}", me, RUN_ID, f"{me.node_id}@127.0.0.1:1",
                         max_backoff_s=0.3)
    run = RestartedRun(clock, options, tmp_path, first, backend)
    stop = asyncio.Event()

    async def on_state(server_state: ServerState) -> None:
        run.states.append(server_state.state)

    task = asyncio.create_task(backend.run(on_state, run.errors.append, stop))
    try:
        yield run
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if not run.first_stopped:
            await first.stop()
        if run.second is not None:
            await run.second.stop()


async def test_a_witness_sent_while_the_coordinator_restarts_reaches_the_new_one(
        run: RestartedRun) -> None:
    backend, states = run.backend, run.states
    await wait_for(lambda: states)
    run.clock.now += 2
    await wait_for(lambda: states[-1].run_state is RunState.Warmup)
    await run.stop_first()
    # The client is ready meanwhile: its warm-up witness must not be lost.
    witness = WarmupWitness(Witness(WitnessProof(position=0, index=0, witness=False)))
    sending = asyncio.create_task(backend.send_warmup_witness(witness))
    await asyncio.sleep(0.5)
    assert not sending.done()  # waiting for a connection, not dropped
    second = await run.restart()
    assert await asyncio.wait_for(sending, 10)
    # The only client's warm-up witness starts the round on the restarted server.
    await wait_for(lambda: second.state.run_state is RunState.RoundTrain)
    assert not run.errors


def witness_of(state: CoordinatorState, mark: bytes) -> RoundWitness:
    """The only client's witness (it is elected every round), its bloom marked."""
    bloom = Bloom(keys=(1, 2, 3, 4, 5, 6, 7, 8))
    bloom.add(mark)
    return RoundWitness(
        witness=Witness(selection_for_round(state).witness_of(0), broadcast_bloom=bloom),
        metadata=WitnessMetadata(step=state.progress.step))


async def test_a_witness_is_never_replayed_into_a_later_round(run: RestartedRun) -> None:
    """What was sent in the seconds before a connection dropped is sent again on the next
    one (the server may have died before reading it). A witness made for step s, replayed
    into a restarted coordinator already at step s+1, was taken as step s+1's witness when
    the same client is elected again: its blooms vouch for step s-1's results, so no
    result of step s reached a quorum and every client applied it with `results: 0`
    although all had trained it. A witness goes only to the step it was made for."""
    backend, states, errors = run.backend, run.states, run.errors
    await wait_for(lambda: states)
    run.clock.now += 2
    await wait_for(lambda: states[-1].run_state is RunState.Warmup)
    assert await backend.send_warmup_witness(WarmupWitness(
        Witness(WitnessProof(position=0, index=0, witness=False))))
    await wait_for(lambda: states[-1].run_state is RunState.RoundTrain)
    earlier = states[-1]
    step = earlier.progress.step
    assert await backend.send_witness(witness_of(earlier, b"vouches for the step before"))
    await wait_for(lambda: run.first.state.run_state is RunState.RoundWitness)
    run.clock.now += 2  # the witness time passes: the next round
    await wait_for(lambda: states[-1].progress.step == step + 1
                   and states[-1].run_state is RunState.RoundTrain)
    await run.stop_first()  # within the replay window of the witness
    second = await run.restart()
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
