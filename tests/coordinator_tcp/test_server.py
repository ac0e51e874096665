"""The coordinator server on loopback: joins, bad peers, observers; the run goes on."""

from __future__ import annotations

import asyncio

import pytest
from tcp_helpers import (
    RUN_ID,
    Clock,
    identity,
    join,
    make_state_file,
    next_state,
    server_options,
    wait_for,
)

from coordinator import (
    Client,
    ClientState,
    Coordinator,
    NodeIdentity,
    RunState,
    Witness,
    WitnessProof,
    decode_state,
)
from coordinator.config import P2PCheckpoint
from coordinator_tcp.client import JoinRefused, ProtocolConnection
from coordinator_tcp.protocol import (
    Challenge,
    ErrorReply,
    Join,
    StateUpdate,
    WarmupWitness,
    Welcome,
    Withdraw,
    WitnessModel,
    decode_server_message,
    encode,
)
from coordinator_tcp.server import CoordinatorServer
from psyche_common.identity import Identity
from psyche_common.tcp.framing import encode_frame, read_frame
from psyche_common.tcp.messages import signed_join


async def raw_connect(server: CoordinatorServer) -> tuple[asyncio.StreamReader,
                                                          asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    challenge = decode_server_message(await read_frame(reader, 1 << 20))
    assert isinstance(challenge, Challenge)
    return reader, writer, challenge.nonce


async def fatal_reply(reader: asyncio.StreamReader) -> ErrorReply:
    reply = decode_server_message(await asyncio.wait_for(read_frame(reader, 1 << 20), 5))
    assert isinstance(reply, ErrorReply) and reply.fatal
    assert await asyncio.wait_for(reader.read(), 5) == b""  # and the server hung up
    return reply


async def test_join_gets_welcome_and_state(server: CoordinatorServer) -> None:
    who = identity(1)
    connection, welcome = await ProtocolConnection.connect(
        "127.0.0.1", server.port, who, RUN_ID, "addr-1", timeout_s=5)
    assert isinstance(welcome, Welcome) and welcome.identity == who.public_key
    update = await next_state(connection)
    state = decode_state(update.state_bytes)
    assert state.run_id == RUN_ID and update.sent_at > 0
    await wait_for(lambda: server.pending == [server.pending[0]] if server.pending else False)
    assert server.pending[0].key == who.public_key
    assert server.p2p_addresses[who.node_id] == "addr-1"
    await connection.close()


async def test_wrong_run_id_is_refused(server: CoordinatorServer) -> None:
    with pytest.raises(JoinRefused) as caught:
        await ProtocolConnection.connect("127.0.0.1", server.port, identity(1), "other-run")
    assert caught.value.error == "WrongRunId" and "not 'other-run'" in caught.value.detail
    assert server.pending == []


async def test_bad_signature_and_forged_identity_are_refused(server: CoordinatorServer) -> None:
    reader, writer, nonce = await raw_connect(server)
    join_message = signed_join(identity(1), nonce, RUN_ID, "a")
    tampered = join_message.model_copy(update={"signature": bytes(64)})
    writer.write(encode_frame(encode(tampered)))
    assert (await fatal_reply(reader)).error == "BadSignature"
    writer.close()

    # Key A signs the challenge but claims to be B: the signature cannot verify for B.
    reader, writer, nonce = await raw_connect(server)
    signed_by_a = signed_join(identity(1), nonce, RUN_ID, "a")
    claims_b = signed_by_a.model_copy(update={"identity": identity(2).public_key})
    writer.write(encode_frame(encode(claims_b)))
    assert (await fatal_reply(reader)).error == "BadSignature"
    writer.close()

    # A signature over an old challenge (replay) does not verify either.
    reader, writer, _nonce = await raw_connect(server)
    writer.write(encode_frame(encode(join_message)))
    assert (await fatal_reply(reader)).error == "BadSignature"
    writer.close()
    assert server.pending == [] and server.stats.handshakes_failed == 3


async def test_message_before_join_and_garbage_handshake(server: CoordinatorServer) -> None:
    reader, writer, _ = await raw_connect(server)
    writer.write(encode_frame(encode(Withdraw())))
    reply = await fatal_reply(reader)
    assert reply.error == "HandshakeFailed" and "expected a join message first" in reply.detail
    writer.close()

    reader, writer, _ = await raw_connect(server)
    writer.write(encode_frame(b"[" * 200_000 + b"]" * 200_000))  # 400 KB of nesting
    reply = await fatal_reply(reader)
    assert reply.error == "HandshakeFailed" and "nested too deeply" in reply.detail
    writer.close()

    reader, writer, _ = await raw_connect(server)
    writer.write(b"\x7f\xff\xff\xff")  # announces a 2 GiB frame
    reply = await fatal_reply(reader)
    assert "exceeds the limit" in reply.detail
    writer.close()


async def test_garbage_after_join_disconnects_only_that_client(
        clocked: tuple[CoordinatorServer, Clock]) -> None:
    server, clock = clocked
    good = await join(server, identity(1))
    bad = await join(server, identity(2))
    await next_state(good)
    await bad.send_raw(b"{not json")
    while True:
        message = await asyncio.wait_for(bad.receive(), 5)
        if isinstance(message, ErrorReply):
            break
    assert message.fatal and "not JSON" in message.detail
    with pytest.raises(asyncio.IncompleteReadError):
        while True:
            await asyncio.wait_for(bad.receive(), 5)
    await wait_for(lambda: len(server.pending) == 1)
    clock.now += 2  # waiting_for_members_extra_time elapses: the good client's epoch starts
    update = await next_state(good)
    while decode_state(update.state_bytes).run_state is not RunState.Warmup:
        update = await next_state(good)
    state = decode_state(update.state_bytes)
    assert [c.id.key for c in state.epoch_state.clients] == [identity(1).public_key]
    await good.close()
    await bad.close()


async def test_flood_of_unfinished_handshakes_does_not_stop_the_run(
        clocked: tuple[CoordinatorServer, Clock]) -> None:
    server, clock = clocked
    good = await join(server, identity(1))
    await next_state(good)
    flood = await asyncio.gather(*[asyncio.open_connection("127.0.0.1", server.port)
                                   for _ in range(200)])
    await wait_for(lambda: server.stats.connections_accepted >= 201)
    assert server.stats.handshakes_refused_busy >= 200 - server.options.max_handshakes_per_address
    # The run advances for the joined client during the flood.
    clock.now += 2
    state = decode_state((await next_state(good)).state_bytes)
    assert state.run_state is RunState.Warmup
    witness = Witness(WitnessProof(position=0, index=0, witness=False))
    await good.send(WarmupWitness(witness=WitnessModel.of(witness)))
    state = decode_state((await next_state(good)).state_bytes)
    assert state.run_state is RunState.RoundTrain
    for _reader, writer in flood:
        writer.close()
    # Once the stalled handshakes time out, new clients can join again.
    await wait_for(lambda: server.connections.handshakes_in_flight == 0, timeout_s=server.options.handshake_timeout_s + 3)
    late = await join(server, identity(3))
    await next_state(late)
    await late.close()
    await good.close()


async def test_observer_gets_states_but_never_joins(
        clocked: tuple[CoordinatorServer, Clock]) -> None:
    server, clock = clocked
    observer = await join(server, identity(9), observe=True)
    first = decode_state((await next_state(observer)).state_bytes)
    assert first.run_state is RunState.WaitingForMembers
    assert server.pending == []
    await observer.send(Withdraw())
    reply = await asyncio.wait_for(observer.receive(), 5)
    while not isinstance(reply, ErrorReply):
        reply = await asyncio.wait_for(observer.receive(), 5)
    assert "read-only" in reply.detail and not reply.fatal
    client = await join(server, identity(1))
    clock.now += 2
    update = await next_state(observer)
    while decode_state(update.state_bytes).run_state is not RunState.Warmup:
        update = await next_state(observer)
    assert [c.id.key for c in decode_state(update.state_bytes).epoch_state.clients] == [
        identity(1).public_key]
    await observer.close()
    await client.close()


async def test_disconnect_withdraws_the_client(clocked: tuple[CoordinatorServer, Clock]) -> None:
    server, clock = clocked
    one, two = await join(server, identity(1)), await join(server, identity(2))
    clock.now += 2
    await wait_for(lambda: server.state.run_state is RunState.Warmup)
    await one.close()
    await wait_for(lambda: server.state.epoch_state.clients[0].state.name == "Withdrawn")
    assert server.state.epoch_state.clients[1].state.name == "Healthy"
    await two.close()


async def test_clients_leaving_at_once_cost_one_broadcast_not_one_each(
        clocked: tuple[CoordinatorServer, Clock]) -> None:
    """Six of eight clients drop together (a partition): they are all withdrawn, and the
    others get the new state once, not six times (N leaving would cost N broadcasts of N
    writes)."""
    server, clock = clocked
    connections = [await join(server, identity(i)) for i in range(1, 9)]
    clock.now += 2
    await wait_for(lambda: server.state.run_state is RunState.Warmup
                   and len(server.state.epoch_state.clients) == 8)
    before = server.stats.broadcasts
    for connection in connections[:6]:
        connection.writer.transport.abort()
    await wait_for(lambda: sum(c.state.name == "Withdrawn"
                               for c in server.state.epoch_state.clients) == 6)
    await asyncio.sleep(0.2)  # any broadcast still to come
    assert server.stats.broadcasts - before <= 2, server.stats.broadcasts - before
    assert {node.key for node in server.pending} == {identity(7).public_key,
                                                     identity(8).public_key}
    for connection in connections[6:]:
        await connection.close()


async def test_same_key_reconnecting_replaces_the_old_connection(server: CoordinatorServer) -> None:
    first = await join(server, identity(1))
    second = await join(server, identity(1))
    await wait_for(lambda: len(server.peers) == 1)
    with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
        while True:
            await asyncio.wait_for(first.receive(), 5)
    assert isinstance(await next_state(second), StateUpdate)
    await second.close()
    await first.close()


async def test_a_listed_client_back_on_a_new_address_is_announced_at_once(
        clocked: tuple[CoordinatorServer, Clock]) -> None:
    """A restarted client process binds a new p2p port; its peers need the new address to
    download its results now, not at the next state change (which may be 10 s away)."""
    server, clock = clocked
    one, two = await join(server, identity(1)), await join(server, identity(2))
    clock.now += 2
    await wait_for(lambda: server.state.run_state is RunState.Warmup)
    key = identity(2).node_id

    moved = f"{key}@127.0.0.1:2"

    async def one_learns_the_move() -> None:
        while (await next_state(one)).p2p_addresses.get(key) != moved:
            pass

    second_two = await join(server, identity(2), address=moved)
    await asyncio.wait_for(one_learns_the_move(), 5)
    assert server.state.run_state is RunState.Warmup  # no state change carried it
    for connection in (one, two, second_two):
        await connection.close()


def test_join_signature_covers_the_run_and_address() -> None:
    who = Identity(b"\x05" * 32)
    a = signed_join(who, b"\x01" * 32, RUN_ID, "addr")
    b = signed_join(who, b"\x01" * 32, RUN_ID, "other-addr")
    assert isinstance(a, Join) and a.signature != b.signature


async def test_pending_leaves_out_dropped_clients_unless_the_run_could_not_start() -> None:
    clock = Clock()
    coordinator = Coordinator.from_state_file(make_state_file(init_min_clients=1))
    server = CoordinatorServer(coordinator, server_options(), clock=clock)
    state = server.state
    state.run_state_start_unix_timestamp = int(clock.now)  # no WaitingForMembers timeout yet
    state.epoch_state.exited_clients = [
        Client(NodeIdentity(identity(1).public_key), ClientState.Dropped),
        Client(NodeIdentity(identity(2).public_key), ClientState.Withdrawn)]
    await server.start()
    connections = [await join(server, identity(i)) for i in (1, 2, 3)]
    try:
        await wait_for(lambda: len(server.peers) == 3)
        keys = [node.key for node in server.pending]
        assert keys == [identity(2).public_key, identity(3).public_key]  # Dropped sits out
        server.state.config = server.state.config.model_copy(update={"init_min_clients": 3})
        assert len(server.pending) == 3  # ...unless the run could not start without it
    finally:
        for connection in connections:
            await connection.close()
        await server.stop()


@pytest.mark.parametrize("phase", [RunState.Cooldown, RunState.WaitingForMembers])
async def test_a_last_epoch_client_that_restarts_between_epochs_still_holds_the_model(
        phase: RunState) -> None:
    """Between epochs (and in the cooldown) the listed clients hold the last epoch's model:
    one that disconnects (killed) and joins again before the warm-up must still count as
    a holder, so the next epoch stays P2P instead of falling back to the stored
    checkpoint."""
    clock = Clock()
    coordinator = Coordinator.from_state_file(make_state_file(init_min_clients=2))
    server = CoordinatorServer(coordinator, server_options(), clock=clock)
    state = server.state
    state.run_state_start_unix_timestamp = int(clock.now)
    state.run_state = phase
    state.model = state.model.model_copy(update={
        "checkpoint": P2PCheckpoint(repo_id=state.model.checkpoint.repo_id)})
    state.epoch_state.clients = [Client(NodeIdentity(identity(1).public_key))]
    await server.start()
    holder = await join(server, identity(1))
    other = await join(server, identity(2))
    try:
        await wait_for(lambda: len(server.peers) == 2)
        await holder.close()  # killed...
        await wait_for(lambda: len(server.peers) == 1)
        assert server.state.epoch_state.clients[0].state is ClientState.Healthy
        holder = await join(server, identity(1))  # ...and back
        for _ in range(40):  # through the cooldown, if in it, and WaitingForMembers
            if server.state.run_state is RunState.Warmup:
                break
            clock.now += 1
            await asyncio.sleep(0.1)
        assert server.state.run_state is RunState.Warmup
        assert isinstance(server.state.model.checkpoint, P2PCheckpoint)
    finally:
        await holder.close()
        await other.close()
        await server.stop()


async def test_a_thousand_idle_connections_from_one_address_never_stop_an_honest_join(
        clocked: tuple[CoordinatorServer, Clock]) -> None:
    """One source opening 1000 connections and saying nothing holds at most its
    per-address share of handshake slots: a client from another address joins at once,
    while the flood is still open."""
    server, _clock = clocked
    flood = await asyncio.gather(*[asyncio.open_connection("127.0.0.1", server.port)
                                   for _ in range(1000)])
    await wait_for(lambda: server.stats.connections_accepted >= 1000, timeout_s=20)
    assert server.connections.handshakes_in_flight <= server.options.max_handshakes_per_address
    assert server.stats.handshakes_refused_busy >= 1000 - server.options.max_handshakes_per_address
    started = asyncio.get_running_loop().time()
    honest, _ = await ProtocolConnection.connect(
        "127.0.0.1", server.port, identity(5), RUN_ID, "honest", local_addr=("127.0.0.2", 0))
    assert asyncio.get_running_loop().time() - started < 2
    await next_state(honest)
    assert identity(5).public_key in [p.key for p in server.pending]
    await honest.close()
    for _reader, writer in flood:
        writer.close()
