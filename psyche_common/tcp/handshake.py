"""The server side of the challenge/join handshake (the client side is `connection.py`), shared by the coordinator server and
the data server: both authenticate a connection the same way before serving it.

    server -> Challenge{nonce};  client -> Join signed over (nonce, run_id, p2p_address)

`accept_join` returns the verified Join, or raises `JoinRejected` (wrong run id, bad
signature: answer it with `send_fatal` and close) or `ProtocolError`/`FrameError` (the
peer did not speak the protocol). Which connections get to handshake at all is
`admission.py`'s (AcceptGate).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

from psyche_common.identity import verify
from psyche_common.tcp.framing import encode_frame, read_frame
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


def _challenge_frame_parts() -> tuple[bytes, bytes]:
    """The Challenge frame around its nonce: every connection's first frame is made by
    splicing its nonce in (what a flood of connections costs the server most often)."""
    marker = bytes(range(32))
    frame = encode_frame(encode(Challenge(nonce=marker)))
    before, found, after = frame.partition(marker.hex().encode())
    assert found and len(frame) == len(before) + 64 + len(after), "the nonce is not hex"
    return before, after


_CHALLENGE_BEFORE, _CHALLENGE_AFTER = _challenge_frame_parts()


def challenge_frame(nonce: bytes) -> bytes:
    """encode_frame(encode(Challenge(nonce=nonce))) for a 32-byte nonce, without pydantic."""
    return _CHALLENGE_BEFORE + nonce.hex().encode() + _CHALLENGE_AFTER


async def accept_join(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                      run_id: str, decode: Callable[[bytes], Any], max_frame: int,
                      serving: str) -> Join:
    """Challenge the peer and verify its signed Join for `run_id`.

    `serving` completes the wrong-run message: "this {serving} {run_id!r}, not ..."."""
    nonce = os.urandom(32)
    writer.write(challenge_frame(nonce))
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
