"""The coordinator server's connections: listening, the signed handshake, each connected
peer (`Peer`: who it is, and writing to it without waiting), and reading each client's
events until it leaves.

What a join, an event or a leave does to the run is the server's (`Served`, server.py);
this module only turns a connection's bytes into those three calls. Untrusted input stops
here (the shared `AcceptGate`, docs/tcp-admission.md): at most
`max_handshakes_per_address` handshakes are in flight from one source address; when
`max_handshakes` are (by default half the process's file descriptors), one past its
deadline or the oldest of the busiest address is closed for the newcomer; frames are
size-limited before they are read, and a garbage frame or a bad signature gets an error
reply and a disconnect, never an exception in the server.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from coordinator import NodeIdentity
from coordinator_tcp.protocol import Join, ProtocolError, decode_client_message
from coordinator_tcp.server_options import ServerOptions, ServerStats
from psyche_common.tcp.admission import AcceptGate
from psyche_common.tcp.framing import SERVER_MAX_FRAME, FrameError, encode_frame, read_frame
from psyche_common.tcp.handshake import JoinRejected, accept_join, send_fatal
from psyche_common.tcp.listener import Listener

log = logging.getLogger(__name__)

# A client that stops reading is cut off rather than let our buffers grow without bound.
MAX_OUTGOING_BUFFER = 64 * 1024 * 1024


class Peer:
    """One joined connection (a client, or a read-only observer): who it is, the p2p
    address and replay class it joined with, and what the server last told it."""

    def __init__(self, identity: NodeIdentity, address: str, writer: asyncio.StreamWriter,
                 observer: bool = False, replay_class: int = 0):
        self.identity = identity
        self.p2p_address = address
        self.replay_class = replay_class  # Join.replay_class, a u16 (0 = none)
        self.writer = writer
        self.observer = observer
        self.notice: str | None = None  # the code of the last Notice it was sent
        self.notice_text = ""  # and its text (a class's shortfall can change, not its code)
        # (state seq, address map version) it last asked for whole (ResyncAddresses)
        self.resynced_version: tuple[int, int] | None = None

    def send(self, payload: bytes) -> bool:
        """Queue `payload` as a frame without waiting; False if the peer is too far behind."""
        return self.send_frame(encode_frame(payload))

    def send_frame(self, frame: bytes) -> bool:
        """Queue a framed message without waiting; False if the peer is too far behind."""
        transport = self.writer.transport
        if transport.is_closing() or transport.get_write_buffer_size() > MAX_OUTGOING_BUFFER:
            return False
        transport.write(frame)
        return True


class Served(Protocol):
    """What the connections report to the server."""

    def joined(self, message: Join, writer: asyncio.StreamWriter) -> Peer:
        """A verified Join: welcome it and return its peer."""
        ...

    def event(self, peer: Peer, message: object) -> None:
        """One message from a joined peer (answered as it comes)."""
        ...

    def left(self, peer: Peer) -> None:
        """The peer's connection ended, whatever the reason."""
        ...


class Connections:
    """The listening socket and every open connection of one server."""

    def __init__(self, options: ServerOptions, stats: ServerStats, run_id: str,
                 served: Served) -> None:
        self.options = options
        self.stats = stats
        self.run_id = run_id
        self.served = served
        self._gate = AcceptGate(options.max_handshakes, options.max_handshakes_per_address,
                                options.handshake_timeout_s, self._handshake_refused)
        self._listener = Listener(self._handle_connection, options.host, options.port)

    @property
    def handshakes_in_flight(self) -> int:
        return self._gate.pending

    @property
    def port(self) -> int:
        return self._listener.port

    async def listen(self) -> None:
        await self._listener.start()
        log.info("admission: up to %d connections in handshake, %d per address, %.1f s each",
                 self._gate.max_pending, self._gate.max_per_address, self._gate.timeout_s)

    async def close(self) -> None:
        """Stop listening and close every connection (each handler sees its closed socket
        and returns within 2 s)."""
        await self._listener.close()

    async def _handle_connection(self, reader: asyncio.StreamReader,
                                 writer: asyncio.StreamWriter) -> None:
        try:
            self.stats.connections_accepted += 1
            peer = await self._gate.admit(writer, lambda: self._handshake(reader, writer))
            if peer is not None:
                try:
                    await self._serve(peer, reader)
                finally:
                    self.served.left(peer)
        except Exception:  # one connection's bug must never take the server down
            log.exception("connection handler failed")

    def _handshake_refused(self, error: str, cause: BaseException | None) -> None:
        if error == "Busy":
            self.stats.handshakes_refused_busy += 1
            return
        if error == "Shed":
            self.stats.handshakes_shed += 1
            return
        self.stats.handshakes_failed += 1
        self.stats.note(f"handshake: {cause!r}")

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> Peer | None:
        try:
            message = await accept_join(reader, writer, run_id=self.run_id,
                                        decode=decode_client_message, max_frame=SERVER_MAX_FRAME,
                                        serving="server runs")
        except JoinRejected as rejected:
            await send_fatal(writer, rejected.error, rejected.detail)
            self.stats.handshakes_failed += 1
            return None
        return self.served.joined(message, writer)

    async def _serve(self, peer: Peer, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                frame = await read_frame(reader, SERVER_MAX_FRAME)
                message = decode_client_message(frame)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            except (FrameError, ProtocolError) as exc:
                self.stats.protocol_errors += 1
                self.stats.note(f"{peer.identity!r}: {exc}")
                await send_fatal(peer.writer, "ProtocolError", str(exc))
                return
            self.served.event(peer, message)
