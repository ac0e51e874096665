"""``GossipTopic``, gossip per run: signed broadcasts flooded over a bounded neighbour set.

Membership is a small HyParView: each node keeps an *active view* of at most
``max_active_view`` neighbours (one bi-stream each, both directions) and a
*passive view* of addresses it has heard of (bootstrap list, coordinator's
client list, peers named by neighbours in ACCEPT/REJECT replies). A
maintenance loop refills the active view up to ``target_neighbours`` from the
passive view, so the overlay heals when peers leave.

Dissemination is eager push: a node delivers a message the first time it sees
its id and forwards it to every active neighbour but the one it came from
(optionally PlumTree lazy push instead, ``GossipConfig.lazy_push``).
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
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

import iroh

from client_image.p2p import framing
from client_image.p2p.address import AddressError, PeerAddress
from client_image.p2p.gossip.tree import BroadcastTree, TreeConfig, decode_ids
from client_image.p2p.gossip.types import (
    GossipMessage,
    GossipStats,
    Neighbour,
    finish_quietly,
)
from client_image.p2p.gossip.wire import (
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
from client_image.p2p.transport import TransportError

if TYPE_CHECKING:
    from client_image.p2p.gossip.service import Gossip

logger = logging.getLogger(__name__)


class GossipTopic:
    """One run's gossip: ``broadcast`` payloads, iterate ``messages()``."""

    def __init__(self, gossip: Gossip, run_id: str) -> None:
        self.run_id = run_id
        self.topic = topic_for_run(run_id)
        self._stats = GossipStats()
        self._gossip = gossip
        self._config = gossip.config
        self._active: dict[bytes, Neighbour] = {}
        self._dialling: set[bytes] = set()
        self._passive: dict[bytes, PeerAddress] = {}
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self._deliveries: asyncio.Queue[GossipMessage] = asyncio.Queue(
            self._config.delivery_queue_size
        )
        self._maintenance: asyncio.Task[None] | None = None
        # fire-and-forget tasks (dials, finishing dropped streams): the event loop keeps only
        # weak references to tasks, so hold them here until they are done
        self._background: set[asyncio.Task[None]] = set()
        config = self._config
        self._tree = BroadcastTree(
            self._send,
            lambda message_id: message_id in self._seen,
            TreeConfig(
                enabled=config.lazy_push,
                graft_timeout_s=config.graft_timeout_s,
                ihave_interval_s=config.ihave_interval_s,
                message_cache_s=config.message_cache_s,
            ),
        )

    # -- application surface -----------------------------------------------------------
    @property
    def stats(self) -> GossipStats:
        self._stats.grafts = self._tree.grafts_sent
        self._stats.prunes = self._tree.prunes_sent
        return self._stats

    async def broadcast(self, payload: bytes) -> bytes:
        """Sign and send ``payload`` to every live peer; returns the message id."""
        message = SignedMessage.create(self._gossip.transport.identity, self.topic, payload)
        self._remember(message.message_id)
        self._stats.sent += 1
        self._tree.on_new_message(message.message_id, encode_message_frame(message), None)
        return message.message_id

    async def messages(self) -> AsyncIterator[GossipMessage]:
        while True:
            yield await self._deliveries.get()

    async def next_message(self, timeout: float) -> GossipMessage:
        return await asyncio.wait_for(self._deliveries.get(), timeout)

    def neighbours(self) -> list[bytes]:
        return sorted(self._active)

    def add_peers(self, addresses: Iterable[PeerAddress], *, hint: bool = False) -> None:
        """Known peers (e.g. the coordinator's client list) become join candidates; `hint`:
        addresses gossiped by peers, used only for peers we know nothing about (see
        Transport.add_peer_address)."""
        own = self._gossip.transport.node_id
        transport = self._gossip.transport
        for offered in addresses:
            peer = offered.node_id
            if peer == own or (hint and peer in self._passive):
                continue
            transport.add_peer_address(offered, hint=hint)
            if peer not in self._passive and len(self._passive) >= self._config.max_passive_view:
                self._passive.pop(random.choice(list(self._passive)))
            self._passive[peer] = transport.known_address(peer) or offered

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._maintenance = asyncio.create_task(self._maintain(), name=f"gossip-{self.run_id}")

    async def leave(self) -> None:
        if self._maintenance is not None:
            self._maintenance.cancel()
        self._tree.close()
        tasks: list[asyncio.Task[None]] = [t for t in [self._maintenance] if t is not None]
        neighbours, self._active = list(self._active.values()), {}
        for neighbour in neighbours:  # finishing our side tells each neighbour we left
            tasks.extend(neighbour.tasks)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(neighbour.send.finish(), 1.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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
                self._spawn(self._dial(peer))
            await asyncio.sleep(self._config.maintenance_interval_s * random.uniform(0.8, 1.2))

    async def _dial(self, peer: bytes) -> None:
        transport = self._gossip.transport
        try:
            connection = await transport.connect(peer, GOSSIP_ALPN)
            stream = await asyncio.wait_for(connection.open_bi(), self._config.handshake_timeout_s)
            send, recv = stream.send(), stream.recv()
            hello = {
                "topic": self.topic.hex(),
                "address": transport.address.to_string(),
                # HyParView's high priority: a node without neighbours must be let in
                "isolated": not self._active,
            }
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
            existing = self._active.get(peer)
            if existing is not None and not self._our_dial_wins(peer):
                await send.finish()  # it dialled us meanwhile: its stream is the one both keep
                return
            self._add_neighbour(peer, send, recv, dialled_by_us=True)
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
        # The dialler's own address, on a connection authenticated as `peer`, is its own
        # word about itself (a restarted peer says where it is now); anything else a hint.
        self._learn_peers([hello.get("address")], sender=peer)
        peers = [a.to_string() for a in self._sample_addresses(exclude=peer)]
        existing = self._active.get(peer)
        # Both sides may dial at once. Both keep the stream dialled by the smaller id,
        # so they never end up keeping different streams (and each closing the other's).
        if self._our_dial_wins(peer):
            if existing is not None or peer in self._dialling:
                return FrameKind.REJECT, {"reason": "duplicate", "peers": peers}
        elif existing is not None and not existing.dialled_by_us:
            return FrameKind.REJECT, {"reason": "duplicate", "peers": peers}
        if existing is None and len(self._active) >= self._config.max_active_view:
            if hello.get("isolated") is not True:
                return FrameKind.REJECT, {"reason": "active view full", "peers": peers}
            self._evict_random_neighbour()
        return FrameKind.ACCEPT, {"peers": peers}

    def _evict_random_neighbour(self) -> None:
        """Make room for an isolated peer; the evicted one stays in the passive view and
        its maintenance loop finds another neighbour."""
        victim = self._active.pop(random.choice(list(self._active)))
        self._tree.neighbour_down(victim.peer)
        for task in victim.tasks:
            task.cancel()
        self._spawn(finish_quietly(victim.send))

    def _our_dial_wins(self, peer: bytes) -> bool:
        return self._gossip.transport.node_id < peer

    def _sample_addresses(self, exclude: bytes) -> list[PeerAddress]:
        known = {p: a for p, a in self._passive.items() if p != exclude}
        return random.sample(list(known.values()), min(8, len(known)))

    def _learn_peers(self, raw: object, sender: bytes | None = None) -> None:
        """Addresses a peer sent: hints, except `sender`'s own address (see add_peers)."""
        if not isinstance(raw, list):
            return
        parsed = []
        for text in raw[:16]:
            try:
                parsed.append(PeerAddress.parse(text))
            except AddressError:
                self._stats.malformed += 1
        self.add_peers([a for a in parsed if a.node_id == sender])
        self.add_peers([a for a in parsed if a.node_id != sender], hint=True)

    def _add_neighbour(
        self, peer: bytes, send: iroh.SendStream, recv: iroh.RecvStream, dialled_by_us: bool
    ) -> None:
        replaced = self._active.get(peer)
        if replaced is not None:  # the losing stream of a simultaneous dial
            for task in replaced.tasks:
                task.cancel()
            self._spawn(finish_quietly(replaced.send))
        queue: asyncio.Queue[bytes] = asyncio.Queue(self._config.neighbour_queue_size)
        neighbour = Neighbour(peer, send, recv, queue, dialled_by_us)
        self._active[peer] = neighbour
        self._tree.neighbour_up(peer)
        neighbour.tasks = [
            asyncio.create_task(neighbour.write_loop()),
            asyncio.create_task(self._read_loop(neighbour)),
        ]

    def _remove_neighbour(self, neighbour: Neighbour) -> None:
        if self._active.get(neighbour.peer) is neighbour:
            del self._active[neighbour.peer]
            self._tree.neighbour_down(neighbour.peer)
        for task in neighbour.tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def serve_neighbour(
        self, peer: bytes, send: iroh.SendStream, recv: iroh.RecvStream
    ) -> None:
        """Run an accepted neighbour until it goes away (called by the ALPN handler)."""
        self._add_neighbour(peer, send, recv, dialled_by_us=False)
        neighbour = self._active[peer]
        await asyncio.gather(*neighbour.tasks, return_exceptions=True)

    # -- dissemination ----------------------------------------------------------------------
    async def _read_loop(self, neighbour: Neighbour) -> None:
        reader = framing.FrameReader(neighbour.recv)
        try:
            while True:
                length = await reader.next_length()
                if length is None:
                    return
                if length > MAX_FRAME_BYTES:
                    self._stats.oversized += 1
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
            if kind in (FrameKind.IHAVE, FrameKind.GRAFT, FrameKind.PRUNE):
                self._on_tree_frame(source, kind, body)
                return
            if kind != FrameKind.MESSAGE:
                raise GossipWireError(f"unexpected {kind.name} frame after the handshake")
            if len(body) > MAX_MESSAGE_BYTES:
                self._stats.oversized += 1
                return
            message = SignedMessage.decode(body)
        except GossipWireError as error:
            logger.debug("malformed gossip frame from %s: %s", source.hex()[:8], error)
            self._stats.malformed += 1
            return
        message_id = message.message_id
        if message_id in self._seen:
            self._stats.duplicates += 1
            self._tree.on_duplicate(source)
            return
        self._remember(message_id)  # also for forged ones: never verify the same bytes twice
        if not message.is_authentic(self.topic):
            self._stats.forged += 1
            return
        if message.sender != self._gossip.transport.node_id:
            try:
                self._deliveries.put_nowait(
                    GossipMessage(message.sender, message.payload, message_id)
                )
                self._stats.delivered += 1
            except asyncio.QueueFull:
                self._stats.dropped_slow_consumer += 1
        self._tree.on_new_message(message_id, frame, source)

    def _on_tree_frame(self, source: bytes, kind: FrameKind, body: bytes) -> None:
        if kind == FrameKind.PRUNE:
            self._tree.on_prune(source)
            return
        try:
            ids = decode_ids(body)
        except ValueError as error:
            raise GossipWireError(str(error)) from None
        if kind == FrameKind.IHAVE:
            self._tree.on_ihave(source, ids)
        else:
            self._tree.on_graft(source, ids)

    def _send(self, peer: bytes, frame: bytes) -> None:
        neighbour = self._active.get(peer)
        if neighbour is None:
            return
        try:
            neighbour.outbox.put_nowait(frame)
        except asyncio.QueueFull:
            self._stats.dropped_slow_neighbour += 1
            return
        if frame[0] == FrameKind.MESSAGE:
            self._stats.forwarded += 1

    def _remember(self, message_id: bytes) -> None:
        now = time.monotonic()
        self._seen[message_id] = now
        horizon = now - self._config.id_retention_s
        while self._seen and (
            len(self._seen) > self._config.max_retained_ids
            or next(iter(self._seen.values())) < horizon
        ):
            self._seen.popitem(last=False)
