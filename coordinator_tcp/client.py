"""Client side of the handshake, shared by the testnet watcher, the data provider and benches.

    connection = await ProtocolConnection.connect(host, port, identity, run_id,
                                                  p2p_address="", observe=True)
    message = await connection.receive()       # StateUpdate | Heartbeat | ErrorReply
    await connection.send(WitnessSubmit(...)); await connection.close()

`connect` performs Challenge -> Join (signed with the identity's Ed25519 key) -> Welcome
and raises `JoinRefused` (with the server's error name and detail) when the server
answers with an ErrorReply instead. The client runtime may use it or speak the same
protocol itself; both are described in `coordinator_tcp.protocol`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from client_image.p2p.identity import Identity
from coordinator_tcp.framing import CLIENT_MAX_FRAME, read_frame, write_frame
from coordinator_tcp.protocol import (
    Challenge,
    ErrorReply,
    Join,
    ProtocolError,
    Welcome,
    decode_server_message,
    encode,
    join_signing_bytes,
)


class JoinRefused(Exception):
    """The server answered the join with an ErrorReply."""

    def __init__(self, error: str, detail: str):
        super().__init__(f"{error}: {detail}")
        self.error = error
        self.detail = detail


def signed_join(identity: Identity, nonce: bytes, run_id: str, p2p_address: str = "",
                *, observe: bool = False, client_version: str = "") -> Join:
    """The Join answering `nonce`, signed by `identity`."""
    signature = identity.sign(join_signing_bytes(nonce, run_id, p2p_address))
    return Join(run_id=run_id, identity=identity.public_key, p2p_address=p2p_address,
                client_version=client_version, signature=signature, observe=observe)


class ProtocolConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 decode: Callable[[bytes], Any] = decode_server_message,
                 max_frame: int = CLIENT_MAX_FRAME):
        self.reader = reader
        self.writer = writer
        self._decode = decode
        self._max_frame = max_frame

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        identity: Identity,
        run_id: str,
        p2p_address: str = "",
        *,
        observe: bool = False,
        timeout_s: float = 10.0,
        decode: Callable[[bytes], Any] = decode_server_message,
        expect_welcome: type[BaseModel] = Welcome,
    ) -> tuple[ProtocolConnection, Any]:
        """Connect and join; returns the connection and the server's welcome message."""
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=2**16), timeout_s)
        connection = cls(reader, writer, decode)
        try:
            welcome = await asyncio.wait_for(
                connection._join(identity, run_id, p2p_address, observe, expect_welcome),
                timeout_s)
        except BaseException:
            await connection.close()
            raise
        return connection, welcome

    async def _join(self, identity: Identity, run_id: str, p2p_address: str, observe: bool,
                    expect_welcome: type[BaseModel]) -> Any:
        challenge = await self.receive()
        if isinstance(challenge, ErrorReply):
            raise JoinRefused(challenge.error, challenge.detail)
        if not isinstance(challenge, Challenge):
            raise ProtocolError(f"expected a challenge, got {challenge.type!r}")
        await self.send(signed_join(identity, challenge.nonce, run_id, p2p_address,
                                    observe=observe))
        reply = await self.receive()
        if isinstance(reply, ErrorReply):
            raise JoinRefused(reply.error, reply.detail)
        if not isinstance(reply, expect_welcome):
            raise ProtocolError(f"expected {expect_welcome.__name__}, got {reply.type!r}")
        return reply

    async def send(self, message: BaseModel) -> None:
        await write_frame(self.writer, encode(message))

    async def send_raw(self, payload: bytes) -> None:
        await write_frame(self.writer, payload)

    async def receive(self) -> Any:
        """The next message; FrameError/ProtocolError on garbage,
        asyncio.IncompleteReadError when the server closed the connection."""
        return self._decode(await read_frame(self.reader, self._max_frame))

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 2)
