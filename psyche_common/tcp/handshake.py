"""The server side of the challenge/join handshake (the client side is `connection.py`), shared by the coordinator server and
the data server: both authenticate a connection the same way before serving it.

    server -> Challenge{nonce};  client -> Join signed over (nonce, run_id, p2p_address)

`accept_join` returns the verified Join, or raises `JoinRejected` (wrong run id, bad
signature: answer it with `send_fatal` and close) or `ProtocolError`/`FrameError` (the
peer did not speak the protocol).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from psyche_common.identity import verify
from psyche_common.tcp.framing import FrameError, encode_frame, read_frame
from psyche_common.tcp.messages import (
    Challenge,
    ErrorReply,
    Join,
    ProtocolError,
    encode,
    join_signing_bytes,
)


class JoinRejected(Exception):
    """A well-formed join this server refuses; `error` is the ErrorReply's name."""

    def __init__(self, error: str, detail: str):
        super().__init__(f"{error}: {detail}")
        self.error = error
        self.detail = detail


async def send_fatal(writer: asyncio.StreamWriter, error: str, detail: str) -> None:
    """Tell the peer why, then close; never raises (the peer may be gone already)."""
    with contextlib.suppress(Exception):
        writer.write(encode_frame(encode(ErrorReply(error=error, detail=detail, fatal=True))))
        await asyncio.wait_for(writer.drain(), 1)
    writer.close()


async def accept_join(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                      run_id: str, decode: Callable[[bytes], Any], max_frame: int,
                      serving: str) -> Join:
    """Challenge the peer and verify its signed Join for `run_id`.

    `serving` completes the wrong-run message: "this {serving} {run_id!r}, not ..."."""
    nonce = os.urandom(32)
    writer.write(encode_frame(encode(Challenge(nonce=nonce))))
    await writer.drain()
    message = decode(await read_frame(reader, max_frame))
    if not isinstance(message, Join):
        raise ProtocolError(f"expected a join message first, got {message.type!r}")
    if message.run_id != run_id:
        raise JoinRejected("WrongRunId", f"this {serving} {run_id!r}, not {message.run_id!r}")
    signed = join_signing_bytes(nonce, message.run_id, message.p2p_address)
    if not verify(message.identity, signed, message.signature):
        raise JoinRejected("BadSignature",
                           "the join signature does not verify for this identity and challenge")
    return message


T = TypeVar("T")
# listen(2) backlog of every server: a burst of connections waits in the kernel's accept
# queue (and is then admitted or told Busy at once) instead of stalling in SYN retries,
# which would delay an honest peer's connect behind the burst.
ACCEPT_BACKLOG = 4096


class AcceptGate:
    """The one gate in front of every server's handshakes. A connection is told `Busy`
    and closed when its source address already has `max_per_address` handshakes in
    flight, or the server `max_pending` in all; each handshake gets `timeout_s` to
    complete (else `HandshakeFailed`). So idle or slow peers cost the server a bounded
    amount per source: one address opening a thousand idle connections holds at most
    `max_per_address` slots, for at most `timeout_s`, and never locks other peers out.

        gate = AcceptGate(max_pending=1024, max_per_address=8, timeout_s=3.0)
        peer = await gate.admit(writer, lambda: handshake(reader, writer))  # None if refused
    """

    def __init__(self, max_pending: int, max_per_address: int, timeout_s: float,
                 on_failure: Callable[[str, BaseException | None], None] = lambda *_: None):
        self.max_pending = max_pending
        self.max_per_address = max_per_address
        self.timeout_s = timeout_s
        self.on_failure = on_failure  # (error name, cause) for each refused connection
        self.pending = 0
        self.pending_by_address: Counter[str] = Counter()

    async def admit(self, writer: asyncio.StreamWriter,
                    handshake: Callable[[], Awaitable[T]]) -> T | None:
        address = _source_address(writer)
        if (self.pending >= self.max_pending
                or self.pending_by_address[address] >= self.max_per_address):
            self.on_failure("Busy", None)
            await send_fatal(writer, "Busy", "too many connections are joining; retry later")
            return None
        self.pending += 1
        self.pending_by_address[address] += 1
        try:
            return await asyncio.wait_for(handshake(), self.timeout_s)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, FrameError,
                ProtocolError) as exc:
            self.on_failure("HandshakeFailed", exc)
            await send_fatal(writer, "HandshakeFailed", str(exc) or type(exc).__name__)
            return None
        finally:
            self.pending -= 1
            self.pending_by_address[address] -= 1
            if not self.pending_by_address[address]:
                del self.pending_by_address[address]


def _source_address(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
