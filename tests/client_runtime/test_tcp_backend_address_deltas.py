"""The client's TCP backend and the coordinator's address changes: a missed change is
recovered (the map handed to the client ends equal to the server's), a client left out
of the epoch says why in its log, and a coordinator of another protocol version stops
the client with a clear message instead of retrying forever."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, ClassVar

import pytest
from tcp_helpers import RUN_ID, Clock, identity, join, make_state_file, server_options, wait_for

from client_image.backends.base import BackendRejected, ServerState
from client_image.backends.tcp import TcpBackend
from coordinator import Coordinator, RunState
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.protocol import StateUpdate
from coordinator_tcp.server import CoordinatorServer
from psyche_common.identity import Identity
from psyche_common.tcp.framing import encode_frame

pytestmark = pytest.mark.timeout(60)


class DroppingConnection(ProtocolConnection):
    """Loses the first StateUpdate that changes the address map (as if never received)."""

    dropped: ClassVar[list[StateUpdate]] = []

    async def receive(self) -> Any:
        while True:
            message = await super().receive()
            if (isinstance(message, StateUpdate) and not DroppingConnection.dropped
                    and not message.addresses_full and message.p2p_addresses):
                DroppingConnection.dropped.append(message)
                continue
            return message


async def test_a_missed_address_change_is_recovered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("client_image.backends.tcp.ProtocolConnection", DroppingConnection)
    DroppingConnection.dropped = []
    clock = Clock()
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file()),
                               server_options(), clock=clock)
    await server.start()
    me = Identity(bytes(31) + b"\x07")
    backend = TcpBackend(f"127.0.0.1:{server.port}", me, RUN_ID, f"{me.node_id}@127.0.0.1:1")
    states: list[ServerState] = []
    stop = asyncio.Event()

    async def on_state(server_state: ServerState) -> None:
        states.append(server_state)

    task = asyncio.create_task(backend.run(on_state, lambda _reply: None, stop))
    others = []
    try:
        await wait_for(lambda: states)
        others = [await join(server, identity(i)) for i in range(2, 5)]
        clock.now += 2
        await wait_for(lambda: server.state.run_state is RunState.Warmup)
        await wait_for(lambda: DroppingConnection.dropped)
        clock.now += 3  # RoundTrain: a state that shows the gap
        await wait_for(lambda: states[-1].state.run_state is RunState.RoundTrain)
        await wait_for(lambda: states[-1].p2p_addresses == server.p2p_addresses)
        assert len(states[-1].p2p_addresses) == 4 and backend.addresses.gaps == 1
        assert backend.addresses.version == server.addresses.version
    finally:
        stop.set()
        for connection in others:
            await connection.close()
        await server.stop()
        await asyncio.wait_for(task, 10)


async def test_a_client_left_out_of_the_epoch_logs_what_it_waits_for(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file()),
                               server_options(), clock=clock)
    await server.start()
    early = await join(server, identity(2))
    stop = asyncio.Event()
    task: asyncio.Task[None] | None = None
    try:
        await wait_for(lambda: server.state.run_state is RunState.Warmup)
        me = Identity(bytes(31) + b"\x08")
        backend = TcpBackend(f"127.0.0.1:{server.port}", me, RUN_ID, "addr")

        async def on_state(_state: ServerState) -> None:
            return None

        with caplog.at_level(logging.INFO, logger="client_image.backends.tcp"):
            task = asyncio.create_task(backend.run(on_state, lambda _reply: None, stop))
            await wait_for(lambda: backend.notice is not None)
        assert backend.notice is not None and backend.notice.code == "epoch_started"
        assert any("waiting for the next one" in r.getMessage() for r in caplog.records)
    finally:
        stop.set()
        await early.close()
        await server.stop()
        if task is not None:
            await asyncio.wait_for(task, 10)


async def test_a_coordinator_of_protocol_2_stops_the_client_with_a_clear_message() -> None:
    async def old_server(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        challenge = {"type": "challenge", "version": 2, "nonce": "00" * 32}
        writer.write(encode_frame(json.dumps(challenge).encode()))
        await writer.drain()
        await asyncio.sleep(1)
        writer.close()

    listener = await asyncio.start_server(old_server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    backend = TcpBackend(f"127.0.0.1:{port}", Identity(bytes(32)), RUN_ID, "addr")
    try:
        with pytest.raises(BackendRejected, match="unsupported protocol version 2: this side "
                           "speaks 3"):
            await asyncio.wait_for(backend.run(_ignore_state, lambda _reply: None,
                                               asyncio.Event()), 10)
    finally:
        listener.close()


async def _ignore_state(_state: ServerState) -> None:
    return None

