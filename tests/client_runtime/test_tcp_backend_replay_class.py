"""The client's TCP backend joins with its replay class (issue 36): a real coordinator
server on loopback keeps it in the state it warms up, sends it back to the client, and
saves it (a restarted server still has it)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from loopback import free_port
from tcp_helpers import RUN_ID, Clock, make_state_file, server_options, wait_for

from client_image.backends.base import ServerState
from client_image.backends.tcp import TcpBackend
from coordinator import Coordinator, CoordinatorState, RunState
from coordinator.messages import Refusal
from coordinator_tcp.persistence import StateStore
from coordinator_tcp.server import CoordinatorServer
from psyche_common.identity import Identity

pytestmark = pytest.mark.timeout(60)
REPLAY_CLASS = 0xBEEF


async def test_the_backend_joins_with_its_class_and_the_state_keeps_it(tmp_path: Path) -> None:
    clock, port = Clock(2_000_000.0), free_port()
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file()),
                               server_options(port=port, save_state_dir=tmp_path), clock=clock)
    await server.start()
    me = Identity(bytes(31) + b"\x07")
    backend = TcpBackend(f"127.0.0.1:{port}", me, RUN_ID, f"{me.node_id}@127.0.0.1:1",
                         replay_class=REPLAY_CLASS, max_backoff_s=0.3)
    states: list[CoordinatorState] = []
    errors: list[Refusal] = []

    async def on_state(server_state: ServerState) -> None:
        states.append(server_state.state)

    stop = asyncio.Event()
    task = asyncio.create_task(backend.run(on_state, errors.append, stop))
    try:
        await wait_for(lambda: states)
        clock.now += 2
        await wait_for(lambda: states[-1].run_state is RunState.Warmup)
        assert [(c.id.key, c.replay_class) for c in states[-1].epoch_state.clients] == [
            (me.public_key, REPLAY_CLASS)]
        server.save_state()
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop()
    saved = StateStore(tmp_path).load()
    assert saved is not None
    assert [c.replay_class for c in saved[0].epoch_state.clients] == [REPLAY_CLASS]
    assert errors == []
