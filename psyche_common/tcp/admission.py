"""Admission: the one gate in front of every server's handshakes (the coordinator server
and the data server), so that honest peers get in while idle or slow connections fill
the server (docs/tcp-admission.md).

A connection is *unauthenticated* from its accept until its signed Join verifies; while
it is, it holds one slot of the handshake pool (`max_pending` slots). A newcomer, and a
slot whose deadline (`timeout_s`) comes:

- its source address already holds `max_per_address` slots: the newcomer is told `Busy`
  and closed (one address never takes more than its share), unless the oldest of them
  is past its deadline, which then makes room;
- the pool is full: the connection longest past its deadline is told `HandshakeFailed`,
  or if none is, the oldest connection of the address holding the most slots is told
  `Busy` (shed); either is closed and the newcomer takes its slot. An honest client from
  an address of its own holds one slot, never the most while any address holds two, so
  however many idle connections fill the pool it gets in, and it finishes its handshake
  (one round trip) long before it could be past its deadline;
- a handshake not done within `timeout_s` is told `HandshakeFailed` and closed while the
  pool is at most half full; in a busier pool it stays, first in line to make room for a
  newcomer. So a flood that fills the pool is closed only as fast as newcomers arrive,
  instead of all at once at its deadline, to come back all at once (ten thousand
  reconnects in a burst overflow the kernel's accept queue, and an honest connect in it
  waits for SYN retries).

Nothing refuses a newcomer for being one too many in all: the pool's size only says when
to shed. The pool is sized from the process's file-descriptor limit (`handshake_pool`),
after raising its soft limit to the hard one (`raise_fd_limit`), so that idle
connections never take the descriptors joined clients need, nor make `accept` fail.

    gate = AcceptGate(max_pending=None, max_per_address=16, timeout_s=10.0)  # None: from fds
    peer = await gate.admit(writer, lambda: handshake(reader, writer))  # None if refused
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable
from typing import TypeVar

from psyche_common.tcp.framing import FrameError, encode_frame
from psyche_common.tcp.handshake import send_fatal
from psyche_common.tcp.messages import ErrorReply, ProtocolError, encode

log = logging.getLogger(__name__)

T = TypeVar("T")

# listen(2) backlog of every server: a burst of connections waits in the kernel's accept
# queue (and is then admitted, or told Busy, at once) instead of stalling in SYN retries,
# which would delay an honest peer's connect behind the burst.
ACCEPT_BACKLOG = 4096
# Descriptors kept for what is not a connection: listening sockets, log and state files,
# pipes, the event loop's own.
FD_RESERVE = 64
# The smallest pool, however low the descriptor limit: below it the server could not take
# a join at all; above the limit, accept fails (and asyncio pauses accepting for 1 s).
MIN_POOL = 16


def _fatal_frame(error: str, detail: str) -> bytes:
    return encode_frame(encode(ErrorReply(error=error, detail=detail, fatal=True)))


BUSY_FRAME = _fatal_frame("Busy", "too many connections are joining; retry later")
TIMEOUT_FRAME = _fatal_frame("HandshakeFailed", "TimeoutError: no signed join in time")
SHED_FRAME = _fatal_frame("Busy", "the handshake pool is full and this connection was the "
                                  "oldest of the busiest address; retry later")


def raise_fd_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit (as Go's runtime does for every
    program); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # an unlimited hard limit above nr_open
            log.warning("could not raise the file-descriptor limit from %d to %d: %s",
                        soft, hard, exc)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def handshake_pool(asked: int | None, fd_limit: int) -> int:
    """The handshake pool's size: `asked`, or half the descriptors left after
    FD_RESERVE when None or more than that (the other half is for joined clients)."""
    room = max(MIN_POOL, (fd_limit - FD_RESERVE) // 2)
    if asked is None:
        return room
    if asked > room:
        log.warning("the file-descriptor limit (%d, ulimit -n) leaves room for %d connections "
                    "in handshake, not the %d asked: the pool is %d, and the oldest of the "
                    "busiest address is shed beyond it", fd_limit, room, asked, room)
        return room
    return max(1, asked)


class _Slot:
    """One connection in handshake."""

    __slots__ = ("address", "closed", "expired", "timer", "writer")

    def __init__(self, address: str, writer: asyncio.StreamWriter) -> None:
        self.address = address
        self.writer = writer
        self.closed = False  # shed or past its deadline: told why and closed by the gate
        self.expired = False  # past its deadline, kept while the pool is busy
        self.timer: asyncio.TimerHandle | None = None


class AcceptGate:
    """Who of the accepted connections may handshake (the rules above); `max_pending`
    None sizes the pool from the descriptor limit, and a number above what the limit
    allows is lowered to it (with a warning)."""

    def __init__(self, max_pending: int | None, max_per_address: int, timeout_s: float,
                 on_failure: Callable[[str, BaseException | None], None] = lambda *_: None):
        self.max_pending = handshake_pool(max_pending, raise_fd_limit())
        self.max_per_address = max(1, max_per_address)
        self.timeout_s = timeout_s
        # (error name, cause) of each refused connection: "Busy" (refused at once),
        # "Shed" (taken out of the full pool for a newcomer), "HandshakeFailed"
        self.on_failure = on_failure
        self.pending = 0
        self.shed = 0  # connections shed so far (not counting those past their deadline)
        # Each address's slots, oldest first (a dict keeps insertion order).
        self._slots: dict[str, dict[_Slot, None]] = {}
        # Addresses by the number of slots they hold, in the order they reached it.
        self._holding: dict[int, dict[str, None]] = {}
        # Slots past their deadline kept while the pool is busy, in the order they expired.
        self._expired: dict[_Slot, None] = {}

    def held_by(self, address: str) -> int:
        return len(self._slots.get(address, ()))

    @property
    def expired(self) -> int:
        return len(self._expired)

    async def admit(self, writer: asyncio.StreamWriter,
                    handshake: Callable[[], Awaitable[T]]) -> T | None:
        address = source_address(writer)
        held = self._slots.get(address)
        if held is not None and len(held) >= self.max_per_address:
            oldest = next(iter(held))
            if not oldest.expired:
                self.on_failure("Busy", None)
                _refuse(writer, BUSY_FRAME)
                return None
            self._time_out(oldest)  # its own address's stale one makes room
        if self.pending >= self.max_pending:
            self._shed_one()
        slot = _Slot(address, writer)
        self._take(slot)
        slot.timer = asyncio.get_running_loop().call_later(self.timeout_s, self._deadline, slot)
        try:
            return await handshake()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, FrameError,
                ProtocolError) as exc:
            if slot.closed:  # told why and closed by the gate: its read just saw the end
                return None
            self.on_failure("HandshakeFailed", exc)
            await send_fatal(writer, "HandshakeFailed", str(exc) or type(exc).__name__)
            return None
        finally:
            if not slot.closed:
                self._release(slot)

    def _deadline(self, slot: _Slot) -> None:
        """A handshake's deadline: closed now while the pool has room to spare (at most
        half full); in a busy pool, marked the first to go when a newcomer needs room and
        looked at again one deadline later. Closing it at once would only make room
        nobody asked for, and a flood reopens what is closed at once: the server's own
        churn, ten thousand connections at a time."""
        if slot.closed:
            return
        if 2 * self.pending <= self.max_pending:
            self._time_out(slot)
            return
        if not slot.expired:
            slot.expired = True
            self._expired[slot] = None
        slot.timer = asyncio.get_running_loop().call_later(self.timeout_s, self._deadline, slot)

    def _shed_one(self) -> None:
        """Make room in the full pool: close the connection longest past its deadline,
        or if none is, the oldest connection of the address holding the most slots (of
        those holding as many, the one that got there first)."""
        if self._expired:
            self._time_out(next(iter(self._expired)))
            return
        most = max(self._holding)
        address = next(iter(self._holding[most]))
        slot = next(iter(self._slots[address]))
        self.shed += 1
        self.on_failure("Shed", None)
        self._close(slot, SHED_FRAME)

    def _time_out(self, slot: _Slot) -> None:
        self.on_failure("HandshakeFailed", TimeoutError("no signed join in time"))
        self._close(slot, TIMEOUT_FRAME)

    def _close(self, slot: _Slot, frame: bytes) -> None:
        """Free the slot now and close its connection: its handshake task sees the closed
        socket at its next read and returns None; a handshake that finished just now sees
        it in its first read as a joined peer."""
        self._release(slot)
        slot.closed = True
        _refuse(slot.writer, frame)

    def _take(self, slot: _Slot) -> None:
        held = self._slots.setdefault(slot.address, {})
        self._move(slot.address, len(held), len(held) + 1)
        held[slot] = None
        self.pending += 1

    def _release(self, slot: _Slot) -> None:
        if slot.timer is not None:
            slot.timer.cancel()
        if slot.expired:
            del self._expired[slot]
        held = self._slots[slot.address]
        self._move(slot.address, len(held), len(held) - 1)
        del held[slot]
        if not held:
            del self._slots[slot.address]
        self.pending -= 1

    def _move(self, address: str, before: int, after: int) -> None:
        if before:
            bucket = self._holding[before]
            del bucket[address]
            if not bucket:
                del self._holding[before]
        if after:
            self._holding.setdefault(after, {})[address] = None


def _refuse(writer: asyncio.StreamWriter, frame: bytes) -> None:
    """Say why and close, without waiting: the frame is small and the peer's buffer empty
    (a close sends what is queued first)."""
    transport = writer.transport
    if not transport.is_closing():
        transport.write(frame)
        transport.close()


def source_address(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
