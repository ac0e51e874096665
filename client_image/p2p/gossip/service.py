"""The node's gossip service: accepts neighbour streams and routes them to topics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

import iroh

from client_image.p2p import framing
from client_image.p2p.address import PeerAddress
from client_image.p2p.gossip.topic import GossipTopic
from client_image.p2p.gossip.types import GossipConfig
from client_image.p2p.gossip.wire import (
    GOSSIP_ALPN,
    MAX_FRAME_BYTES,
    FrameKind,
    GossipWireError,
    decode_control,
    encode_control,
    split_frame,
    topic_for_run,
)
from client_image.p2p.transport import Transport

logger = logging.getLogger(__name__)


class Gossip:
    """The node's gossip service: one ``GossipTopic`` per subscribed run."""

    def __init__(self, transport: Transport, config: GossipConfig | None = None) -> None:
        self.transport = transport
        self.config = config or GossipConfig()
        self._topics: dict[bytes, GossipTopic] = {}
        transport.register_protocol(GOSSIP_ALPN, self._handle_connection)

    def subscribe(self, run_id: str, bootstrap: Iterable[PeerAddress] = ()) -> GossipTopic:
        topic = topic_for_run(run_id)
        if topic in self._topics:
            return self._topics[topic]
        subscription = GossipTopic(self, run_id)
        subscription.add_peers(bootstrap)
        self._topics[topic] = subscription
        subscription.start()
        return subscription

    async def stop(self) -> None:
        for subscription in list(self._topics.values()):
            await subscription.leave()
        self._topics.clear()

    async def _handle_connection(self, connection: iroh.Connection) -> None:
        peer = connection.remote_id().to_bytes()
        streams: set[asyncio.Task[None]] = set()
        try:
            while True:
                stream = await connection.accept_bi()
                task = asyncio.create_task(self._handle_stream(peer, stream.send(), stream.recv()))
                streams.add(task)
                task.add_done_callback(streams.discard)
        except iroh.IrohError:
            pass  # connection closed
        finally:
            for task in streams:
                task.cancel()

    async def _handle_stream(
        self, peer: bytes, send: iroh.SendStream, recv: iroh.RecvStream
    ) -> None:
        try:
            frame = await asyncio.wait_for(
                framing.read_frame(recv, MAX_FRAME_BYTES), self.config.handshake_timeout_s
            )
            if frame is None:
                return
            kind, body = split_frame(frame)
            hello = decode_control(body)
            if kind != FrameKind.HELLO:
                raise GossipWireError(f"expected HELLO, got {kind.name}")
            subscription = self._topics.get(bytes.fromhex(str(hello.get("topic", ""))))
            reply: dict[str, object]
            if subscription is None:
                reply_kind, reply = FrameKind.REJECT, {"reason": "not subscribed to this topic"}
            else:
                reply_kind, reply = subscription.handshake_reply(peer, hello)
            await send.write_all(framing.encode_frame(encode_control(reply_kind, reply)))
            if reply_kind == FrameKind.ACCEPT and subscription is not None:
                await subscription.serve_neighbour(peer, send, recv)
            else:
                await send.finish()
        except (
            TimeoutError,
            GossipWireError,
            ValueError,
            framing.StreamClosed,
            framing.FrameTooLarge,
        ) as error:
            logger.debug("gossip handshake from %s failed: %s", peer.hex()[:8], error)
            # tell the peer why, then end the stream so it never waits on us
            with contextlib.suppress(Exception):
                reason = {"reason": f"bad handshake: {error}"[:500]}
                await send.write_all(framing.encode_frame(encode_control(FrameKind.REJECT, reason)))
                await send.finish()
        except iroh.IrohError:
            return
