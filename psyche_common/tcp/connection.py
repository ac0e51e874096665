"""The one client-side TCP connection of every program: connect, join, talk, reconnect.

    connection, welcome = await Connection.connect(host, port, identity, run_id,
                                                   decode=decode_server_message)
    message = await connection.receive()     # whatever `decode` makes of the next frame
    await connection.send(message); await connection.close()

    await keep_connected(session, stop=stop_event, backoff=Backoff(max_s=5.0),
                         permanent=(Rejected,), on_lost=note)

`connect` performs Challenge -> Join (signed with the identity's Ed25519 key) -> welcome
and raises `JoinRefused` (with the server's error name and detail) when the server
answers with an ErrorReply instead. `keep_connected` runs one session (connect, then
serve messages until the connection ends) again and again with capped, jittered
exponential backoff; the client runtime, the run-manager's observer and the testnet's
watcher all stay connected through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from pydantic import BaseModel

from psyche_common.identity import Identity
from psyche_common.tcp.framing import CLIENT_MAX_FRAME, FrameError, read_frame, write_frame
from psyche_common.tcp.messages import (
    Challenge,
    ErrorReply,
    ProtocolError,
    Welcome,
    encode,
    signed_join,
)

# What a lost connection or a peer speaking garbage raises.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError, TimeoutError, asyncio.IncompleteReadError, FrameError, ProtocolError)


class JoinRefused(Exception):
    """The server answered the join with an ErrorReply."""

    def __init__(self, error: str, detail: str):
        super().__init__(f"{error}: {detail}" if detail else error)
        self.error = error
        self.detail = detail


# What `keep_connected` retries: a lost connection, garbage, or a refused join.
RETRIED_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, JoinRefused)


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) or a ValueError naming `what` was wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be host:port, got {text!r}")
    return host.strip("[]"), int(port)


class Connection:
    # The decoder `connect` uses when none is given; a protocol's subclass sets its own.
    default_decode: ClassVar[Callable[[bytes], Any] | None] = None

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 decode: Callable[[bytes], Any], max_frame: int = CLIENT_MAX_FRAME):
        self.reader = reader
        self.writer = writer
        self._decode = decode
        self._max_frame = max_frame
        self._send_lock = asyncio.Lock()  # concurrent senders never interleave frames

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        identity: Identity,
        run_id: str,
        p2p_address: str = "",
        *,
        decode: Callable[[bytes], Any] | None = None,
        observe: bool = False,
        client_version: str = "",
        replay_class: int = 0,
        timeout_s: float = 10.0,
        expect_welcome: type[BaseModel] = Welcome,
        local_addr: tuple[str, int] | None = None,
    ) -> tuple[Self, Any]:
        """Connect (from `local_addr` when given) and join; returns the connection and the
        server's welcome message. Frames are decoded by `decode`, else `default_decode`."""
        decode = decode or cls.default_decode
        if decode is None:
            raise TypeError(f"{cls.__name__}.connect needs a decode function")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=2**16, local_addr=local_addr), timeout_s)
        connection = cls(reader, writer, decode)
        try:
            welcome = await asyncio.wait_for(connection._join(
                identity, run_id, p2p_address, observe, client_version, replay_class,
                expect_welcome),
                timeout_s)
        except BaseException:
            await connection.close()
            raise
        return connection, welcome

    async def _join(self, identity: Identity, run_id: str, p2p_address: str, observe: bool,
                    client_version: str, replay_class: int,
                    expect_welcome: type[BaseModel]) -> Any:
        challenge = await self.receive()
        if isinstance(challenge, ErrorReply):
            raise JoinRefused(challenge.error, challenge.detail)
        if not isinstance(challenge, Challenge):
            raise ProtocolError(f"expected a challenge, got {challenge.type!r}")
        await self.send(signed_join(identity, challenge.nonce, run_id, p2p_address,
                                    observe=observe, client_version=client_version,
                                    replay_class=replay_class))
        reply = await self.receive()
        if isinstance(reply, ErrorReply):
            raise JoinRefused(reply.error, reply.detail)
        if not isinstance(reply, expect_welcome):
            raise ProtocolError(f"expected {expect_welcome.__name__}, got {reply.type!r}")
        return reply

    async def send(self, message: BaseModel) -> None:
        await self.send_raw(encode(message))

    async def send_raw(self, payload: bytes) -> None:
        async with self._send_lock:
            await write_frame(self.writer, payload)

    async def receive(self) -> Any:
        """The next message; FrameError/ProtocolError on garbage,
        asyncio.IncompleteReadError when the server closed the connection."""
        return self._decode(await read_frame(self.reader, self._max_frame))

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 2)


@dataclass(frozen=True)
class Backoff:
    """Wait before reconnect attempt n (n >= 1): min(max_s, first_s * 2**(n-1)), times a
    random factor in [1 - jitter, 1] so that a restarted server is not hit by every
    client at the same instant."""

    first_s: float = 0.25
    max_s: float = 5.0
    jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delay(self, failures: int) -> float:
        base = min(self.max_s, self.first_s * 2.0 ** min(max(failures - 1, 0), 16))
        return base * self.rng.uniform(1.0 - self.jitter, 1.0)


async def keep_connected(
    session: Callable[[], Awaitable[None]],
    *,
    stop: asyncio.Event,
    backoff: Backoff,
    on_lost: Callable[[BaseException | None], None] = lambda _error: None,
) -> None:
    """Run `session` until `stop` is set, again after each end, waiting `backoff`.

    A session that ends (the server closed it) or raises one of CONNECTION_ERRORS or
    JoinRefused is reported to `on_lost` (None for a clean end) and retried; anything
    else (a refusal the caller deems permanent, a bug) propagates. The backoff starts
    over after a session that ended without an error."""
    failures = 0
    while not stop.is_set():
        try:
            await session()
            failures = 0
            on_lost(None)
        except RETRIED_ERRORS as error:
            on_lost(error)
        failures += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff.delay(failures))
