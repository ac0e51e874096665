"""The client's side of the TCP backend: handshake, state stream, messages to the server.

The connection is re-established with backoff when it drops (a restarted server, a
network blip); each new connection re-joins with a fresh signed challenge. A fatal
error reply that retrying cannot fix (wrong run id, bad signature) is raised as
`BackendRejected` so the client exits with a clear message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import BaseModel

from client_image.p2p.identity import Identity
from coordinator import CoordinatorState, StateDecodeError, decode_state
from coordinator_tcp.client import signed_join
from coordinator_tcp.framing import CLIENT_MAX_FRAME, FrameError, read_frame, write_frame
from coordinator_tcp.protocol import (
    PERMANENT_JOIN_ERRORS,
    Challenge,
    ErrorReply,
    Heartbeat,
    ProtocolError,
    StateUpdate,
    Welcome,
    decode_server_message,
    encode,
)

log = logging.getLogger(__name__)



class BackendRejected(RuntimeError):
    """The server refused this client for a reason retrying will not change."""


@dataclass(frozen=True)
class ServerState:
    state: CoordinatorState
    p2p_addresses: dict[str, str]
    server_time: int


StateCallback = Callable[[ServerState], Awaitable[None]]
ErrorCallback = Callable[[ErrorReply], None]


def parse_server_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--server-addr must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


class TcpBackend:
    def __init__(self, server_addr: str, identity: Identity, run_id: str, p2p_address: str,
                 client_version: str = "", *, max_backoff_s: float = 5.0,
                 connect_timeout_s: float = 5.0):
        self.host, self.port = parse_server_addr(server_addr)
        self.identity = identity
        self.run_id = run_id
        self.p2p_address = p2p_address
        self.client_version = client_version
        self.max_backoff_s = max_backoff_s
        self.connect_timeout_s = connect_timeout_s
        self._writer: asyncio.StreamWriter | None = None
        self._send_lock = asyncio.Lock()
        self.connected = asyncio.Event()
        self.reconnects = 0

    async def _connect_once(self, on_state: StateCallback, on_error: ErrorCallback) -> None:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, limit=2**16), self.connect_timeout_s)
        try:
            challenge = decode_server_message(await read_frame(reader, CLIENT_MAX_FRAME))
            if not isinstance(challenge, Challenge):
                raise ProtocolError(f"expected a challenge, got {challenge.type!r}")
            await write_frame(writer, encode(signed_join(
                self.identity, challenge.nonce, self.run_id, self.p2p_address,
                client_version=self.client_version)))
            self._writer = writer
            while True:
                message = decode_server_message(await read_frame(reader, CLIENT_MAX_FRAME))
                if isinstance(message, Welcome):
                    self.connected.set()
                elif isinstance(message, StateUpdate):
                    try:
                        state = decode_state(message.state_bytes)
                    except (StateDecodeError, ValueError) as exc:
                        log.error("undecodable coordinator state: %s", exc)
                        continue
                    await on_state(ServerState(state, message.p2p_addresses, message.server_time))
                elif isinstance(message, ErrorReply):
                    if message.fatal and message.error in PERMANENT_JOIN_ERRORS:
                        raise BackendRejected(f"{message.error}: {message.detail}")
                    on_error(message)
                elif isinstance(message, Heartbeat):
                    pass
        finally:
            self.connected.clear()
            self._writer = None
            writer.close()

    async def run(self, on_state: StateCallback, on_error: ErrorCallback,
                  stop: asyncio.Event) -> None:
        """Stay connected until `stop` is set; reconnect with jittered backoff."""
        attempt = 0
        while not stop.is_set():
            try:
                await self._connect_once(on_state, on_error)
                attempt = 0
            except BackendRejected:
                raise
            except (OSError, TimeoutError, asyncio.IncompleteReadError, FrameError,
                    ProtocolError) as exc:
                log.warning("coordinator connection lost: %r", exc)
            attempt += 1
            self.reconnects += 1
            delay = min(self.max_backoff_s, 0.25 * 2**min(attempt, 6)) * random.uniform(0.5, 1.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def send(self, message: BaseModel) -> bool:
        """Send one message; False if not connected (the caller decides whether it matters)."""
        writer = self._writer
        if writer is None:
            return False
        async with self._send_lock:
            try:
                await write_frame(writer, encode(message))
            except (OSError, ConnectionError):
                return False
        return True
