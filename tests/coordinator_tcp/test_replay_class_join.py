"""A client's replay class over TCP (issue 36): the Join carries it, the server passes the
connected clients' classes to tick, a warm-up keeps them in the state every client gets,
a class that is not a u16 is refused in one line while the server stays up, and with
verification on a client of a class nobody else has stays pending while three of another
class start the epoch."""

from __future__ import annotations

import asyncio

from tcp_helpers import (
    RUN_ID,
    Clock,
    identity,
    make_state_file,
    next_state,
    server_options,
    wait_for,
)

from coordinator import Coordinator, NodeIdentity, RunState, decode_state
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.protocol import (
    Challenge,
    ErrorReply,
    Notice,
    decode_server_message,
    encode,
)
from coordinator_tcp.server import CoordinatorServer
from coordinator_tcp.summary import summarize
from psyche_common.identity import Identity
from psyche_common.tcp.framing import encode_frame, read_frame
from psyche_common.tcp.messages import signed_join

H100_CLASS, H200_CLASS, RARE_CLASS = 0x51A3, 0x0C07, 0x7777


async def join_with_class(server: CoordinatorServer, who: Identity,
                          replay_class: int) -> ProtocolConnection:
    connection, _welcome = await ProtocolConnection.connect(
        "127.0.0.1", server.port, who, RUN_ID, f"{who.node_id}@127.0.0.1:1",
        replay_class=replay_class, timeout_s=5)
    return connection


async def next_notice(connection: ProtocolConnection) -> Notice:
    """The next Notice the connection gets (state updates and heartbeats skipped)."""

    async def wait() -> Notice:
        while True:
            message = await connection.receive()
            if isinstance(message, Notice):
                return message

    return await asyncio.wait_for(wait(), 5)


async def test_two_clients_of_one_class_and_one_of_another_keep_their_classes(
        clocked: tuple[CoordinatorServer, Clock]) -> None:
    server, clock = clocked
    classes = {identity(1).public_key: H100_CLASS, identity(2).public_key: H100_CLASS,
               identity(3).public_key: H200_CLASS}
    connections = [await join_with_class(server, identity(i), classes[identity(i).public_key])
                   for i in (1, 2, 3)]
    await wait_for(lambda: len(server.pending) == 3)
    assert {node.key: c for node, c in server.replay_classes().items()} == classes
    clock.now += 2
    await wait_for(lambda: server.state.run_state is RunState.Warmup
                   and len(server.state.epoch_state.clients) == 3)
    assert {c.id.key: c.replay_class for c in server.state.epoch_state.clients} == classes
    # ...and so does the state the clients receive (and derive their follow plan from)
    for _ in range(20):
        state = decode_state((await next_state(connections[0])).state_bytes)
        if state.run_state is RunState.Warmup:
            break
    assert {c.id.key: c.replay_class for c in state.epoch_state.clients} == classes
    for connection in connections:
        await connection.close()


async def test_a_join_with_a_class_past_u16_is_refused_and_the_server_stays_up(
        server: CoordinatorServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    challenge = decode_server_message(await read_frame(reader, 1 << 20))
    assert isinstance(challenge, Challenge)
    join = signed_join(identity(1), challenge.nonce, RUN_ID, "a")
    writer.write(encode_frame(encode(join.model_copy(update={"replay_class": 70_000}))))
    reply = decode_server_message(await asyncio.wait_for(read_frame(reader, 1 << 20), 5))
    assert isinstance(reply, ErrorReply) and reply.fatal
    assert "replay_class" in reply.detail and "65535" in reply.detail
    assert "\n" not in reply.detail
    assert await asyncio.wait_for(reader.read(), 5) == b""  # and the server hung up
    writer.close()
    assert server.pending == []
    # the server still serves: a good join of the same key is welcomed with its class
    connection = await join_with_class(server, identity(1), 65535)
    await wait_for(lambda: len(server.pending) == 1)
    assert list(server.replay_classes().values()) == [65535]
    await connection.close()


async def test_a_verified_epoch_starts_with_three_of_a_class_and_a_unique_class_waits() -> None:
    clock = Clock()
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file(
        verification_percent=50, init_min_clients=3)), server_options(), clock=clock)
    await server.start()
    rare, h100s = identity(9), [identity(i) for i in (1, 2, 3)]
    connections = [await join_with_class(server, rare, RARE_CLASS)]  # joins first
    try:
        connections += [await join_with_class(server, who, H100_CLASS) for who in h100s]
        await wait_for(lambda: len(server.pending) == 4)
        summary = summarize(server.state, server.now(), pending=server.pending,
                            replay_classes=server.replay_classes())
        assert summary.waiting == ("waiting for 3 clients, 4 connected: starting; 1 waiting "
                                   "for 2 more clients of its replay class")
        # The rare client is told why it waits (it was eligible alone; the joins after it
        # made its class too small), rather than "the epoch started before it joined".
        # (told again as its shortfall moved: 1 more with two joiners, 2 more with four)
        notices = [await next_notice(connections[0]) for _ in range(2)]
        assert [n.code for n in notices] == ["replay_class", "replay_class"]
        assert notices[0].text.startswith("waiting for 1 more client of this client's replay")
        assert notices[1].text.startswith("waiting for 2 more clients of this client's replay")
        clock.now += 2
        await wait_for(lambda: server.state.run_state is RunState.Warmup)
        listed = [(c.id.key, c.replay_class) for c in server.state.epoch_state.clients]
        assert listed == [(who.public_key, H100_CLASS) for who in h100s]
        # the unique class stays connected and pending, not refused, and keeps its reason
        assert rare.public_key in {node.key for node in server.pending}
        assert server.peers[NodeIdentity(rare.public_key)].notice == "replay_class"
        for _ in range(20):  # what the clients receive lists the same three
            state = decode_state((await next_state(connections[0])).state_bytes)
            if state.run_state is RunState.Warmup:
                break
        assert [(c.id.key, c.replay_class) for c in state.epoch_state.clients] == listed
    finally:
        for connection in connections:
            await connection.close()
        await server.stop()
