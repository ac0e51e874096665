"""psyche_common.tcp.admission: the AcceptGate on real loopback connections (a Listener,
source addresses of 127.0.0.0/8), and the handshake pool's size from the descriptor limit.

The gate's "handshake" here reads one line: an idle peer never sends it."""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import AsyncIterator

import pytest

from psyche_common.tcp.admission import (
    FD_RESERVE,
    MIN_POOL,
    AcceptGate,
    handshake_pool,
    raise_fd_limit,
)
from psyche_common.tcp.framing import read_frame
from psyche_common.tcp.listener import Listener
from psyche_common.tcp.messages import ErrorReply

Peer = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class GatedLineServer:
    """A listener whose every connection goes through `gate`, then echoes one line."""

    def __init__(self, gate: AcceptGate) -> None:
        self.gate = gate
        self.refusals: list[str] = []
        gate.on_failure = lambda error, _cause: self.refusals.append(error)
        self.listener = Listener(self._handle, "127.0.0.1", 0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await self.gate.admit(writer, reader.readline)
        if line:
            writer.write(b"welcome " + line)
            await writer.drain()
            await reader.read()

    async def connect(self, address: str) -> Peer:
        peer = await asyncio.open_connection("127.0.0.1", self.listener.port,
                                             local_addr=(address, 0))
        await asyncio.sleep(0.05)  # the server has accepted it: the order of arrival is known
        return peer


async def refusal(reader: asyncio.StreamReader) -> ErrorReply:
    message = ErrorReply.model_validate_json(await asyncio.wait_for(read_frame(reader, 1 << 16), 2))
    assert message.fatal
    assert await asyncio.wait_for(reader.read(), 2) == b""  # and closed
    return message


async def still_open(reader: asyncio.StreamReader) -> bool:
    try:
        await asyncio.wait_for(reader.read(1), 0.2)
    except TimeoutError:
        return True
    return False


@pytest.fixture
async def gated() -> AsyncIterator[GatedLineServer]:
    server = GatedLineServer(AcceptGate(max_pending=4, max_per_address=3, timeout_s=10))
    await server.listener.start()
    yield server
    await server.listener.close()


async def test_a_full_pool_sheds_the_oldest_of_the_busiest_address_for_the_newcomer(
        gated: GatedLineServer) -> None:
    busy = [await gated.connect("127.0.0.2") for _ in range(3)]  # 3 slots, the most
    lone = await gated.connect("127.0.0.3")  # 1 slot, older than busy's newest
    assert gated.gate.pending == 4  # full
    reader, writer = await gated.connect("127.0.0.4")
    shed = await refusal(busy[0][0])
    assert shed.error == "Busy" and "oldest of the busiest address" in shed.detail
    assert [await still_open(r) for r, _w in (*busy[1:], lone)] == [True, True, True]
    assert gated.refusals == ["Shed"] and gated.gate.shed == 1 and gated.gate.pending == 4
    # .2 still holds the most (2 against 1 each): the next newcomer sheds its oldest left.
    later = await gated.connect("127.0.0.5")
    await refusal(busy[1][0])
    assert await still_open(lone[0]) and gated.refusals == ["Shed", "Shed"]
    writer.write(b"hello\n")  # the first newcomer was never shed: its handshake completes
    assert await asyncio.wait_for(reader.readline(), 2) == b"welcome hello\n"
    assert gated.gate.pending == 3
    for _reader, peer_writer in (*busy, lone, (reader, writer), later):
        peer_writer.close()


async def test_an_address_over_its_share_is_refused_busy_at_once(gated: GatedLineServer) -> None:
    held = [await gated.connect("127.0.0.2") for _ in range(3)]
    reader, writer = await gated.connect("127.0.0.2")
    refused = await refusal(reader)
    assert refused.error == "Busy" and "retry later" in refused.detail
    assert gated.refusals == ["Busy"] and gated.gate.pending == 3
    assert all([await still_open(r) for r, _w in held])
    held[0][1].write(b"hi\n")  # a slot of its own frees up when one handshake completes...
    assert await asyncio.wait_for(held[0][0].readline(), 2) == b"welcome hi\n"
    again, again_writer = await gated.connect("127.0.0.2")  # ...and the address may retry
    again_writer.write(b"again\n")
    assert await asyncio.wait_for(again.readline(), 2) == b"welcome again\n"
    for _reader, peer_writer in (*held, (reader, writer), (again, again_writer)):
        peer_writer.close()


async def test_a_handshake_past_its_deadline_is_told_so_and_frees_its_slot() -> None:
    server = GatedLineServer(AcceptGate(max_pending=4, max_per_address=3, timeout_s=0.3))
    await server.listener.start()
    try:
        reader, writer = await server.connect("127.0.0.2")
        failed = await refusal(reader)
        assert failed.error == "HandshakeFailed"
        assert server.refusals == ["HandshakeFailed"] and server.gate.pending == 0
        writer.close()
    finally:
        await server.listener.close()


async def test_in_a_busy_pool_a_handshake_past_its_deadline_stays_until_room_is_needed() -> None:
    # A deadline long enough for the three to be in before the first one's comes.
    server = GatedLineServer(AcceptGate(max_pending=4, max_per_address=3, timeout_s=1.0))
    await server.listener.start()
    try:
        stale = [await server.connect("127.0.0.2") for _ in range(3)]  # 3 of 4: busy
        await asyncio.sleep(2.0)  # past the deadline: kept, nobody needs the room
        assert [await still_open(r) for r, _w in stale] == [True, True, True]
        assert server.gate.expired == 3 and server.refusals == []
        fresh = await server.connect("127.0.0.3")  # the pool has a slot left
        assert server.gate.pending == 4 and server.refusals == []
        newcomer, newcomer_writer = await server.connect("127.0.0.4")  # full: makes room
        failed = await refusal(stale[0][0])  # the one longest past its deadline
        assert failed.error == "HandshakeFailed" and server.refusals == ["HandshakeFailed"]
        assert await still_open(stale[1][0]) and await still_open(fresh[0])
        # .2 is at its cap, but its oldest is past its deadline: it makes room for .2.
        again = await server.connect("127.0.0.2")
        assert (await refusal(stale[1][0])).error == "HandshakeFailed"
        newcomer_writer.write(b"in\n")  # a handshake done: its slot is free
        assert await asyncio.wait_for(newcomer.readline(), 2) == b"welcome in\n"
        fresh[1].close()  # 2 of 4 left: room to spare, the last stale one goes at its next look
        assert (await refusal(stale[2][0])).error == "HandshakeFailed"
        assert (await refusal(again[0])).error == "HandshakeFailed"  # and at its deadline
        assert server.gate.pending == 0 and server.gate.expired == 0
        for _reader, writer in (*stale, again, (newcomer, newcomer_writer)):
            writer.close()
    finally:
        await server.listener.close()


def test_the_pool_is_half_the_descriptors_left_and_says_when_asked_for_more(
        caplog: pytest.LogCaptureFixture) -> None:
    assert handshake_pool(None, 20000) == (20000 - FD_RESERVE) // 2 == 9968
    assert handshake_pool(1024, 20000) == 1024
    with caplog.at_level(logging.WARNING, logger="psyche_common.tcp.admission"):
        assert handshake_pool(5000, 1024) == (1024 - FD_RESERVE) // 2 == 480
    [warning] = caplog.messages
    assert "file-descriptor limit (1024" in warning and "not the 5000 asked" in warning
    assert handshake_pool(None, 10) == MIN_POOL


def test_raise_fd_limit_lifts_the_soft_limit_to_the_hard_one() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert raise_fd_limit() == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if hard != resource.RLIM_INFINITY:
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
