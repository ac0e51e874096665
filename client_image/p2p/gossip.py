"""Gossip per run: signed broadcasts flooded over a bounded neighbour set.

Membership is a small HyParView: each node keeps an *active view* of at most
``max_active_view`` neighbours (one bi-stream each, both directions) and a
*passive view* of addresses it has heard of (bootstrap list, coordinator's
client list, peers named by neighbours in ACCEPT/REJECT replies). A
maintenance loop refills the active view up to ``target_neighbours`` from the
passive view, so the overlay heals when peers leave.

Dissemination is eager push: a node delivers a message the first time it sees
its id and forwards it to every active neighbour but the one it came from.
With a connected overlay every live peer receives every message, also the ones
not directly connected to the sender, and each is delivered to the application
exactly once (ids retained ``id_retention_s``). Forged, malformed and
oversized messages are dropped and counted in ``GossipStats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import iroh

from client_image.p2p import framing
from client_image.p2p.address import AddressError, PeerAddress
from client_image.p2p.gossip_wire import (
    GOSSIP_ALPN,
    MAX_FRAME_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_SKIPPABLE_FRAME_BYTES,
    FrameKind,
    GossipWireError,
    SignedMessage,
    decode_control,
    encode_control,
    encode_message_frame,
    split_frame,
    topic_for_run,
)
from client_image.p2p.transport import Transport, TransportError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GossipConfig:
    max_active_view: int = 8
    target_neighbours: int = 3
    max_passive_view: int = 64
    maintenance_interval_s: float = 1.0
    handshake_timeout_s: float = 5.0
    id_retention_s: float = 120.0
    max_retained_ids: int = 200_000
    delivery_queue_size: int = 10_000
    neighbour_queue_size: int = 1_024


@dataclass
class GossipStats:
    delivered: int = 0
    sent: int = 0
    forwarded: int = 0
    duplicates: int = 0
    forged: int = 0
    malformed: int = 0
    oversized: int = 0
    dropped_slow_consumer: int = 0
    dropped_slow_neighbour: int = 0


@dataclass(frozen=True)
class GossipMessage:
    sender: bytes
    payload: bytes
    message_id: bytes


@dataclass
class _Neighbour:
    peer: bytes
    send: iroh.SendStream
    recv: iroh.RecvStream
    outbox: asyncio.Queue[bytes]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def write_loop(self) -> None:
        while True:
            frames = [await self.outbox.get()]
            while not self.outbox.empty():  # coalesce a burst into one binding call
                frames.append(self.outbox.get_nowait())
            await self.send.write_all(b"".join(framing.encode_frame(f) for f in frames))


class GossipTopic:
    """One run's gossip: ``broadcast`` payloads, iterate ``messages()``."""

    def __init__(self, gossip: Gossip, run_id: str) -> None:
        self.run_id = run_id
        self.topic = topic_for_run(run_id)
        self.stats = GossipStats()
        self._gossip = gossip
        self._config = gossip.config
        self._active: dict[bytes, _Neighbour] = {}
        self._dialling: set[bytes] = set()
        self._passive: dict[bytes, PeerAddress] = {}
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self._deliveries: asyncio.Queue[GossipMessage] = asyncio.Queue(
            self._config.delivery_queue_size
        )
        self._maintenance: asyncio.Task[None] | None = None

    # -- application surface -----------------------------------------------------------
    async def broadcast(self, payload: bytes) -> bytes:
        """Sign and send ``payload`` to every live peer; returns the message id."""
        message = SignedMessage.create(self._gossip.transport.identity, self.topic, payload)
        self._remember(message.message_id)
        self.stats.sent += 1
        self._forward(encode_message_frame(message), exclude=None)
        return message.message_id

    async def messages(self) -> AsyncIterator[GossipMessage]:
        while True:
            yield await self._deliveries.get()

    async def next_message(self, timeout: float) -> GossipMessage:
        return await asyncio.wait_for(self._deliveries.get(), timeout)

    def neighbours(self) -> list[bytes]:
        return sorted(self._active)

    def add_peers(self, addresses: Iterable[PeerAddress]) -> None:
        """Known peers (e.g. the coordinator's client list) become join candidates."""
        own = self._gossip.transport.node_id
        for address in addresses:
            if address.node_id == own:
                continue
            self._gossip.transport.add_peer_address(address)
            if (
                address.node_id not in self._passive
                and len(self._passive) >= self._config.max_passive_view
            ):
                self._passive.pop(random.choice(list(self._passive)))
            self._passive[address.node_id] = address

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._maintenance = asyncio.create_task(self._maintain(), name=f"gossip-{self.run_id}")

    async def leave(self) -> None:
        if self._maintenance is not None:
            self._maintenance.cancel()
        tasks: list[asyncio.Task[None]] = [t for t in [self._maintenance] if t is not None]
        neighbours, self._active = list(self._active.values()), {}
        for neighbour in neighbours:  # finishing our side tells each neighbour we left
            tasks.extend(neighbour.tasks)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(neighbour.send.finish(), 1.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- membership ------------------------------------------------------------------------
    async def _maintain(self) -> None:
        while True:
            missing = self._config.target_neighbours - len(self._active) - len(self._dialling)
            candidates = [
                p for p in self._passive if p not in self._active and p not in self._dialling
            ]
            random.shuffle(candidates)
            for peer in candidates[: max(missing, 0)]:
                self._dialling.add(peer)
                asyncio.create_task(self._dial(peer))
            await asyncio.sleep(self._config.maintenance_interval_s * random.uniform(0.8, 1.2))

    async def _dial(self, peer: bytes) -> None:
        transport = self._gossip.transport
        try:
            connection = await transport.connect(peer, GOSSIP_ALPN)
            stream = await asyncio.wait_for(connection.open_bi(), self._config.handshake_timeout_s)
            send, recv = stream.send(), stream.recv()
            hello = {"topic": self.topic.hex(), "address": transport.address.to_string()}
            await send.write_all(framing.encode_frame(encode_control(FrameKind.HELLO, hello)))
            reply = await asyncio.wait_for(
                framing.read_frame(recv, MAX_FRAME_BYTES), self._config.handshake_timeout_s
            )
            if reply is None:
                raise GossipWireError("peer closed the stream during the handshake")
            kind, body = split_frame(reply)
            control = decode_control(body)
            self._learn_peers(control.get("peers"))
            if kind != FrameKind.ACCEPT:
                logger.debug("peer %s declined: %s", peer.hex()[:8], control.get("reason"))
                return
            if peer in self._active:  # it dialled us meanwhile and we accepted
                await send.finish()
                return
            self._add_neighbour(peer, send, recv)
        except (
            TimeoutError,
            TransportError,
            GossipWireError,
            framing.StreamClosed,
            iroh.IrohError,
        ) as error:
            logger.debug("dial %s failed: %s", peer.hex()[:8], error)
            transport.drop_connection(peer, GOSSIP_ALPN)
        finally:
            self._dialling.discard(peer)

    def handshake_reply(
        self, peer: bytes, hello: dict[str, object]
    ) -> tuple[FrameKind, dict[str, object]]:
        """Accept a HELLO unless a duplicate or the active view is full (HyParView-like)."""
        self._learn_peers([hello.get("address")])
        peers = [a.to_string() for a in self._sample_addresses(exclude=peer)]
        own = self._gossip.transport.node_id
        # both sides dialled at once: keep the connection dialled by the smaller id
        if peer in self._active or (peer in self._dialling and own < peer):
            return FrameKind.REJECT, {"reason": "duplicate", "peers": peers}
        if len(self._active) >= self._config.max_active_view:
            return FrameKind.REJECT, {"reason": "active view full", "peers": peers}
        return FrameKind.ACCEPT, {"peers": peers}

    def _sample_addresses(self, exclude: bytes) -> list[PeerAddress]:
        known = {p: a for p, a in self._passive.items() if p != exclude}
        chosen = random.sample(list(known.values()), min(8, len(known)))
        return chosen

    def _learn_peers(self, raw: object) -> None:
        if not isinstance(raw, list):
            return
        parsed = []
        for text in raw[:16]:
            try:
                parsed.append(PeerAddress.parse(text))
            except AddressError:
                self.stats.malformed += 1
        self.add_peers(parsed)

    def _add_neighbour(self, peer: bytes, send: iroh.SendStream, recv: iroh.RecvStream) -> None:
        neighbour = _Neighbour(peer, send, recv, asyncio.Queue(self._config.neighbour_queue_size))
        self._active[peer] = neighbour
        neighbour.tasks = [
            asyncio.create_task(neighbour.write_loop()),
            asyncio.create_task(self._read_loop(neighbour)),
        ]

    def _remove_neighbour(self, neighbour: _Neighbour) -> None:
        if self._active.get(neighbour.peer) is neighbour:
            del self._active[neighbour.peer]
        for task in neighbour.tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def serve_neighbour(
        self, peer: bytes, send: iroh.SendStream, recv: iroh.RecvStream
    ) -> None:
        """Run an accepted neighbour until it goes away (called by the ALPN handler)."""
        self._add_neighbour(peer, send, recv)
        neighbour = self._active[peer]
        await asyncio.gather(*neighbour.tasks, return_exceptions=True)

    # -- dissemination ----------------------------------------------------------------------
    async def _read_loop(self, neighbour: _Neighbour) -> None:
        reader = framing.FrameReader(neighbour.recv)
        try:
            while True:
                length = await reader.next_length()
                if length is None:
                    return
                if length > MAX_FRAME_BYTES:
                    self.stats.oversized += 1
                    if length > MAX_SKIPPABLE_FRAME_BYTES:
                        return  # not worth reading: drop this neighbour
                    await reader.skip(length)
                    continue
                self._on_frame(neighbour.peer, await reader.body(length))
        except (framing.StreamClosed, iroh.IrohError):
            return
        finally:
            self._remove_neighbour(neighbour)

    def _on_frame(self, source: bytes, frame: bytes) -> None:
        try:
            kind, body = split_frame(frame)
            if kind != FrameKind.MESSAGE:
                raise GossipWireError(f"unexpected {kind.name} frame after the handshake")
            if len(body) > MAX_MESSAGE_BYTES:
                self.stats.oversized += 1
                return
            message = SignedMessage.decode(body)
        except GossipWireError as error:
            logger.debug("malformed gossip frame from %s: %s", source.hex()[:8], error)
            self.stats.malformed += 1
            return
        message_id = message.message_id
        if message_id in self._seen:
            self.stats.duplicates += 1
            return
        self._remember(message_id)  # also for forged ones: never verify the same bytes twice
        if not message.is_authentic(self.topic):
            self.stats.forged += 1
            return
        if message.sender != self._gossip.transport.node_id:
            try:
                self._deliveries.put_nowait(
                    GossipMessage(message.sender, message.payload, message_id)
                )
                self.stats.delivered += 1
            except asyncio.QueueFull:
                self.stats.dropped_slow_consumer += 1
        self._forward(frame, exclude=source)

    def _forward(self, frame: bytes, exclude: bytes | None) -> None:
        for peer, neighbour in list(self._active.items()):
            if peer == exclude:
                continue
            try:
                neighbour.outbox.put_nowait(frame)
                self.stats.forwarded += 1
            except asyncio.QueueFull:
                self.stats.dropped_slow_neighbour += 1

    def _remember(self, message_id: bytes) -> None:
        now = time.monotonic()
        self._seen[message_id] = now
        horizon = now - self._config.id_retention_s
        while self._seen and (
            len(self._seen) > self._config.max_retained_ids
            or next(iter(self._seen.values())) < horizon
        ):
            self._seen.popitem(last=False)


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

    async def unsubscribe(self, run_id: str) -> None:
        subscription = self._topics.pop(topic_for_run(run_id), None)
        if subscription is not None:
            await subscription.leave()

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
