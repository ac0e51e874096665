"""The p2p addresses in the coordinator's state messages: the whole map once, then only
the changes; clients that left are dropped; a receiver that misses a change recovers;
old-shape (protocol 1) messages are refused with a clear error; a client left out of
the epoch is told why.

Also a small measurement (printed with `-s`): bytes per client per broadcast after 100
and after 1000 clients joined and left, and what protocol 1 would have sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tcp_helpers import RUN_ID, Clock, identity, join, make_state_file, server_options, wait_for

from coordinator import MAX_CLIENTS, Coordinator, NodeIdentity, RunState
from coordinator.machine import coordinator_from_state
from coordinator_tcp.addresses import AddressBook, AddressMirror
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.persistence import StateStore
from coordinator_tcp.protocol import (
    Challenge,
    ErrorReply,
    Notice,
    ResyncAddresses,
    StateUpdate,
    VersionMismatch,
    decode_server_message,
)
from coordinator_tcp.server import CoordinatorServer
from psyche_common.identity import Identity
from psyche_common.tcp.framing import encode_frame, read_frame

pytestmark = pytest.mark.timeout(120)


def address(who: Identity, port: int) -> str:
    return f"{who.node_id}@127.0.0.1:{port}"


@dataclass
class Follower:
    """One connection that keeps an AddressMirror of what it receives (and may drop a
    state on purpose); counts the bytes of each state."""

    connection: ProtocolConnection
    mirror: AddressMirror = field(default_factory=AddressMirror)
    states: list[StateUpdate] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    frame_bytes: list[int] = field(default_factory=list)
    address_bytes: list[int] = field(default_factory=list)
    drop: Callable[[StateUpdate], bool] = lambda _update: False
    dropped: int = 0
    asked: int = 0

    async def run(self) -> None:
        try:
            await self._follow()
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the server stopped

    async def _follow(self) -> None:
        while True:
            message = await self.connection.receive()
            if isinstance(message, Notice):
                self.notices.append(message)
                continue
            if not isinstance(message, StateUpdate):
                continue
            frame = message.to_frame()
            self.frame_bytes.append(len(frame))
            self.address_bytes.append(len(frame) - len(message.model_copy(update={
                "p2p_addresses": {}, "p2p_removed": []}).to_frame()))
            if self.drop(message):
                self.dropped += 1
                continue
            self.states.append(message)
            if self.mirror.apply(message):
                self.asked += 1
                await self.connection.send(ResyncAddresses())


async def follow(server: CoordinatorServer, who: Identity, port: int = 1,
                 drop: Callable[[StateUpdate], bool] | None = None,
                 ) -> tuple[Follower, asyncio.Task[None]]:
    follower = Follower(await join(server, who, address=address(who, port)))
    if drop is not None:
        follower.drop = drop
    return follower, asyncio.create_task(follower.run())


async def join_many(server: CoordinatorServer, people: list[Identity],
                    batch: int = 8) -> list[ProtocolConnection]:
    """Join `people` (8 at a time: the per-address handshake limit), each on its own port."""
    connections: list[ProtocolConnection] = []
    for start in range(0, len(people), batch):
        chunk = people[start:start + batch]
        connections += await asyncio.gather(*(
            join(server, who, address=address(who, 40_000 + start + i))
            for i, who in enumerate(chunk)))
    return connections


async def step(server: CoordinatorServer, clock: Clock, seconds: float,
               until: Callable[[], object] | None = None) -> None:
    before = server.stats.broadcasts
    clock.now += seconds
    await wait_for(until or (lambda: server.stats.broadcasts > before))


async def advance_until(server: CoordinatorServer, clock: Clock,
                        condition: Callable[[], object], seconds: float = 2,
                        tries: int = 20) -> None:
    """Move the clock `seconds` at a time (letting the server tick) until `condition`."""
    for _ in range(tries):
        if condition():
            return
        clock.now += seconds
        await asyncio.sleep(0.2)
    raise AssertionError("condition not reached")


async def stop(task: asyncio.Task[None], follower: Follower) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await follower.connection.close()


def clocked_server(init_min_clients: int = 1) -> tuple[CoordinatorServer, Clock]:
    clock = Clock()
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file()),
                               server_options(), clock=clock)
    set_init_min_clients(server, init_min_clients)
    return server, clock


def set_init_min_clients(server: CoordinatorServer, count: int) -> None:
    """Start an epoch only when `count` are there (past the cap too: a test's way to have
    more clients waiting than an epoch takes)."""
    server.state.config = server.state.config.model_copy(update={"init_min_clients": count})


# ------------------------------------------------------------------ the address book alone
def test_the_book_numbers_changes_and_drops_what_is_not_kept() -> None:
    book = AddressBook()
    book.set("a", "1")
    book.set("b", "2")
    assert book.commit({"a", "b"}) == ({"a": "1", "b": "2"}, []) and book.version == 1
    assert book.commit({"a", "b"}) == ({}, []) and book.version == 1  # nothing new
    book.set("b", "3")
    book.set("c", "4")
    assert book.commit({"a", "b", "c"}) == ({"b": "3", "c": "4"}, []) and book.version == 2
    assert book.commit({"c"}) == ({}, ["a", "b"]) and book.version == 3
    assert book.addresses == book.sent == {"c": "4"}

    loaded = AddressBook({"a": "1"})  # saved before a restart: counts as sent
    assert loaded.sent == {"a": "1"} and loaded.version == 1

    mirror = AddressMirror()
    full = StateUpdate(state="", p2p_addresses={"c": "4"}, addresses_seq=3, addresses_full=True)
    assert not mirror.apply(full)
    missed = StateUpdate(state="", p2p_addresses={"d": "5"}, addresses_seq=5)  # 4 was lost
    assert mirror.apply(missed) and mirror.version is None and mirror.gaps == 1
    assert not mirror.apply(StateUpdate(state="", addresses_seq=5))  # asked once per gap
    assert not mirror.apply(full.model_copy(update={"addresses_seq": 5,
                                                   "p2p_addresses": {"d": "5"}}))
    assert mirror.addresses == {"d": "5"} and mirror.version == 5
    assert not mirror.apply(StateUpdate(state="", p2p_removed=["d"], addresses_seq=6))
    assert mirror.addresses == {} and mirror.version == 6


# ------------------------------------------------------------------ clients that left
async def joined_then_left(leavers: int) -> dict[str, float]:
    """A client that stays and `leavers` that join while the run waits for members, are
    sent at the epoch's start (their addresses with them) and leave; the run goes on into
    the next epoch. Bytes per broadcast the stayer gets after they
    left, a late joiner's first state, and what protocol 1 (the whole map ever joined in
    every state) would have sent."""
    server, clock = clocked_server(init_min_clients=leavers + 1)  # all join, then it starts
    await server.start()
    try:
        stayer_id = identity(1)
        stayer, task = await follow(server, stayer_id)
        people = [identity(10_000 + i) for i in range(leavers)]
        connections = await join_many(server, people)
        ever_joined = {stayer_id.node_id: address(stayer_id, 1)} | {
            who.node_id: address(who, 40_000 + i) for i, who in enumerate(people)}
        await step(server, clock, 2, lambda: server.state.run_state is RunState.Warmup)
        await wait_for(lambda: len(stayer.mirror.addresses) == leavers + 1)
        for connection in connections:
            await connection.close()
        await wait_for(lambda: len(server.peers) == 1)
        set_init_min_clients(server, 1)
        # Through the epoch (nobody witnesses: it ends) and into the next one: the
        # leavers are neither connected nor in it.
        await advance_until(server, clock, lambda: len(server.p2p_addresses) == 1
                            and server.state.run_state is RunState.Warmup)
        await wait_for(lambda: stayer.mirror.version == server.addresses.version)
        assert server.p2p_addresses == {stayer_id.node_id: address(stayer_id, 1)}
        assert stayer.mirror.addresses == server.addresses.sent == server.p2p_addresses
        assert stayer.asked == 0  # nothing was missed
        # The steady broadcasts after they left: a few ticks of the new epoch.
        mark = len(stayer.frame_bytes)
        await step(server, clock, 3)  # RoundTrain
        await step(server, clock, 3)  # RoundWitness
        await wait_for(lambda: len(stayer.frame_bytes) >= mark + 2)
        after = stayer.frame_bytes[mark:]
        address_after = stayer.address_bytes[mark:]
        late, late_task = await follow(server, identity(2), port=2)
        await wait_for(lambda: late.frame_bytes)
        v1_map = len(json.dumps(ever_joined, separators=(",", ":")))
        await stop(late_task, late)
        await stop(task, stayer)
        return {"bytes_per_client_per_broadcast": sum(after) / len(after),
                "address_bytes_per_broadcast": sum(address_after) / len(address_after),
                "late_joiner_first_state_bytes": late.frame_bytes[0],
                "v1_bytes_per_client_per_broadcast": sum(after) / len(after) + v1_map,
                "largest_address_delta_bytes": max(stayer.address_bytes[1:mark])}
    finally:
        await server.stop()


async def test_addresses_of_clients_that_left_are_dropped_and_bytes_stay_flat() -> None:
    small, large = await joined_then_left(100), await joined_then_left(1000)
    print("\naddress deltas:", json.dumps({
        "bytes_per_client_per_tick_100": small["bytes_per_client_per_broadcast"],
        "bytes_per_client_per_tick_1000": large["bytes_per_client_per_broadcast"],
        "address_bytes_per_tick_100": small["address_bytes_per_broadcast"],
        "address_bytes_per_tick_1000": large["address_bytes_per_broadcast"],
        "late_joiner_first_state_bytes_100": small["late_joiner_first_state_bytes"],
        "late_joiner_first_state_bytes_1000": large["late_joiner_first_state_bytes"],
        "one_time_address_delta_bytes_1000": large["largest_address_delta_bytes"],
        "protocol1_bytes_per_client_per_tick_100": small["v1_bytes_per_client_per_broadcast"],
        "protocol1_bytes_per_client_per_tick_1000": large["v1_bytes_per_client_per_broadcast"],
    }))
    assert small["address_bytes_per_broadcast"] == large["address_bytes_per_broadcast"] == 0
    assert large["bytes_per_client_per_broadcast"] <= 1.2 * small["bytes_per_client_per_broadcast"]
    assert (large["late_joiner_first_state_bytes"]
            <= 1.2 * small["late_joiner_first_state_bytes"])


async def test_a_restarted_server_gives_the_saved_map_whole(
        tmp_path: Path) -> None:
    clock = Clock()
    options = server_options(save_state_dir=tmp_path, reconnect_grace_s=30)
    first = CoordinatorServer(Coordinator.from_state_file(make_state_file()), options,
                              clock=clock)
    await first.start()
    people = [identity(i) for i in range(1, 4)]
    connections = await join_many(first, people)
    clock.now += 2
    await wait_for(lambda: first.state.run_state is RunState.Warmup)
    saved = dict(first.p2p_addresses)
    await first.stop()
    assert json.loads((tmp_path / "p2p_addresses.json").read_text()) == saved
    for connection in connections:
        await connection.close()

    loaded = StateStore(tmp_path).load()
    assert loaded is not None and loaded[1] == saved and len(saved) == 3
    second = CoordinatorServer(coordinator_from_state(loaded[0]), options, clock=clock,
                               p2p_addresses=loaded[1], resumed=True)
    await second.start()
    try:
        back, task = await follow(second, people[0], port=40_000)
        await wait_for(lambda: back.states)
        assert back.states[0].addresses_full and back.mirror.addresses == saved
        await stop(task, back)
    finally:
        await second.stop()


# ------------------------------------------------------------------ a missed change
async def test_a_receiver_that_misses_a_change_asks_and_ends_with_the_servers_map() -> None:
    server, clock = clocked_server()
    await server.start()
    try:
        missed: list[StateUpdate] = []

        def drop_first_change(update: StateUpdate) -> bool:
            if not missed and not update.addresses_full and update.p2p_addresses:
                missed.append(update)
                return True
            return False

        me, task = await follow(server, identity(1), drop=drop_first_change)
        others = await join_many(server, [identity(i) for i in range(2, 6)])
        await step(server, clock, 2, lambda: server.state.run_state is RunState.Warmup)
        await wait_for(lambda: missed)
        assert me.mirror.addresses != server.addresses.sent  # it lacks the others
        # The next state (no address change) shows the gap: it asks, gets the whole map.
        await step(server, clock, 3, lambda: server.state.run_state is RunState.RoundTrain)
        await wait_for(lambda: me.asked == 1 and me.states[-1].addresses_full)
        assert me.mirror.gaps == 1 and me.mirror.version == server.addresses.version
        assert me.mirror.addresses == server.addresses.sent == server.p2p_addresses
        assert len(me.mirror.addresses) == 5
        # A second ask for the same map brings nothing more (no amplification).
        full_states = sum(s.addresses_full for s in me.states)
        await me.connection.send(ResyncAddresses())
        # and later changes follow on from the whole map
        moved = address(identity(2), 9)
        await others[0].close()
        others[0] = await join(server, identity(2), address=moved)
        await wait_for(lambda: me.mirror.addresses.get(identity(2).node_id) == moved)
        assert sum(s.addresses_full for s in me.states) == full_states
        assert me.mirror.addresses == server.addresses.sent and me.asked == 1
        for connection in others:
            await connection.close()
        await stop(task, me)
    finally:
        await server.stop()


# ------------------------------------------------------------------ old-shape messages
def test_an_old_shape_state_is_refused_with_a_clear_error() -> None:
    old = json.dumps({"type": "state", "version": 2, "state": "AA==",
                      "p2p_addresses": {"ab": "x"}, "server_time": 1}).encode()
    with pytest.raises(VersionMismatch, match="unsupported protocol version 2: this side "
                       "speaks 3"):
        decode_server_message(old)


async def test_an_old_client_join_is_refused_with_the_reason() -> None:
    server, _clock = clocked_server()
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        challenge = decode_server_message(await read_frame(reader, 1 << 20))
        assert isinstance(challenge, Challenge)
        old_join = {"type": "join", "version": 1, "run_id": RUN_ID,
                    "identity": identity(1).public_key.hex(), "p2p_address": "",
                    "signature": "00" * 64}
        writer.write(encode_frame(json.dumps(old_join).encode()))
        reply = decode_server_message(await asyncio.wait_for(read_frame(reader, 1 << 20), 5))
        assert isinstance(reply, ErrorReply) and reply.fatal
        assert "unsupported protocol version 1" in reply.detail
        writer.close()
        assert not server.peers
    finally:
        await server.stop()


# ------------------------------------------------------------------ left out of the epoch
async def wait_notice(follower: Follower, code: str) -> Notice:
    await wait_for(lambda: any(n.code == code for n in follower.notices), 10)
    return next(n for n in follower.notices if n.code == code)


async def test_a_client_beyond_the_epoch_cap_is_told_it_waits_for_the_next_one() -> None:
    server, clock = clocked_server(init_min_clients=MAX_CLIENTS + 1)
    await server.start()
    try:
        first = await join_many(server, [identity(100 + i) for i in range(MAX_CLIENTS)])
        extra, task = await follow(server, identity(1))
        notice = await wait_notice(extra, "epoch_full")
        assert notice.text.startswith(f"the epoch is full ({MAX_CLIENTS} clients): waiting "
                                      "for the next one") and notice.cap == MAX_CLIENTS
        await wait_for(lambda: server.state.run_state is RunState.Warmup)  # all 257 came
        assert len(server.state.epoch_state.clients) == MAX_CLIENTS
        assert server.state.index_of(NodeIdentity(identity(1).public_key)) is None
        await asyncio.sleep(0.2)
        assert [n.code for n in extra.notices] == ["epoch_full"]  # told once, not per state
        # Everyone else leaves: the next epoch takes it, and it is told so.
        for connection in first:
            await connection.close()
        await wait_for(lambda: len(server.peers) == 1)
        set_init_min_clients(server, 1)
        await advance_until(server, clock, lambda: any(
            n.code == "taking_part" for n in extra.notices))
        assert server.state.index_of(NodeIdentity(identity(1).public_key)) is not None
        await stop(task, extra)
    finally:
        await server.stop()


async def test_a_client_joining_a_started_epoch_is_told_it_waits_for_the_next_one() -> None:
    server, clock = clocked_server()
    await server.start()
    try:
        early, early_task = await follow(server, identity(1))
        await step(server, clock, 2, lambda: server.state.run_state is RunState.Warmup)
        late, late_task = await follow(server, identity(2), port=2)
        notice = await wait_notice(late, "epoch_started")
        assert "waiting for the next one" in notice.text and "1 clients" in notice.text
        assert not early.notices
        await stop(late_task, late)
        await stop(early_task, early)
    finally:
        await server.stop()

