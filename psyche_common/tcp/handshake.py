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


class AcceptGate:
    """The one gate in front of every server's handshakes: at most `max_pending` in flight
    (a further connection is told `Busy` and closed), each bounded by `timeout_s` (a peer
    that does not complete it is told `HandshakeFailed` and closed).

        gate = AcceptGate(max_pending=64, timeout_s=5.0, on_failure=note)
        peer = await gate.admit(writer, lambda: handshake(reader, writer))  # None if refused
    """

    def __init__(self, max_pending: int, timeout_s: float,
                 on_failure: Callable[[str, BaseException | None], None] = lambda *_: None):
        self.max_pending = max_pending
        self.timeout_s = timeout_s
        self.on_failure = on_failure  # (error name, cause) for each refused connection
        self.pending = 0

    async def admit(self, writer: asyncio.StreamWriter,
                    handshake: Callable[[], Awaitable[T]]) -> T | None:
        if self.pending >= self.max_pending:
            self.on_failure("Busy", None)
            await send_fatal(writer, "Busy", "too many connections are joining; retry later")
            return None
        self.pending += 1
        try:
            return await asyncio.wait_for(handshake(), self.timeout_s)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, FrameError,
                ProtocolError) as exc:
            self.on_failure("HandshakeFailed", exc)
            await send_fatal(writer, "HandshakeFailed", str(exc) or type(exc).__name__)
            return None
        finally:
            self.pending -= 1
