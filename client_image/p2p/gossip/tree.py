"""Broadcast tree over the active view: PlumTree (Leitão, Pereira, Rodrigues 2007).

Flooding every message over every overlay edge costs each node ``degree``
copies per message. PlumTree keeps the flood's reliability at a fraction of
the traffic:

- each neighbour is *eager* (gets full messages) or *lazy* (gets only ids);
  new neighbours start eager;
- a duplicate arriving from an eager neighbour means a cycle: PRUNE it, both
  ends demote that edge to lazy; what stays eager converges to a spanning tree;
- lazy neighbours receive IHAVE(ids), batched every ``ihave_interval_s``;
- an id announced by IHAVE but not received within ``graft_timeout_s`` is
  requested with GRAFT from an announcer, and that edge becomes eager again:
  the tree repairs itself when a peer leaves.

Recent messages are cached ``message_cache_s`` to answer GRAFTs, and their
ids are offered to every new neighbour (catch-up after a partition or a join).
IHAVE/GRAFT repair also runs when lazy push is disabled (plain flooding).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from client_image.p2p.gossip.wire import FrameKind

ID_BYTES = 32
MAX_IDS_PER_FRAME = 120  # 120 · 32 B keeps an IHAVE/GRAFT frame under the 4 KiB message size


@dataclass(frozen=True)
class TreeConfig:
    enabled: bool = True
    graft_timeout_s: float = 0.2
    ihave_interval_s: float = 0.05
    message_cache_s: float = 60.0
    max_cached_messages: int = 10_000
    max_catch_up_ids: int = 1_000


def encode_ids(kind: FrameKind, ids: list[bytes]) -> bytes:
    return bytes([kind]) + b"".join(ids)


def decode_ids(body: bytes) -> list[bytes]:
    """Ids of an IHAVE/GRAFT body; ValueError when the body is not whole ids."""
    if len(body) % ID_BYTES or len(body) > MAX_IDS_PER_FRAME * ID_BYTES:
        raise ValueError(f"id list of {len(body)} bytes is not at most {MAX_IDS_PER_FRAME} ids")
    return [body[i : i + ID_BYTES] for i in range(0, len(body), ID_BYTES)]


class BroadcastTree:
    """Eager/lazy bookkeeping for one topic; ``send(peer, frame)`` queues a frame."""

    def __init__(
        self,
        send: Callable[[bytes, bytes], None],
        seen: Callable[[bytes], bool],
        config: TreeConfig,
    ) -> None:
        self._send = send
        self._seen = seen
        self.config = config
        self.eager: set[bytes] = set()
        self.lazy: set[bytes] = set()
        self._cache: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()
        self._announcers: dict[bytes, list[bytes]] = {}
        self._timers: dict[bytes, asyncio.TimerHandle] = {}
        self._pending_ihave: dict[bytes, list[bytes]] = {}
        self._flush: asyncio.TimerHandle | None = None
        self.grafts_sent = 0
        self.prunes_sent = 0

    # -- membership ------------------------------------------------------------------------
    def neighbour_up(self, peer: bytes) -> None:
        """New neighbours start eager, and are told (IHAVE) every cached message id:
        anti-entropy, so what was broadcast while a peer was cut off (or before it
        joined) is grafted over the new edge instead of being lost."""
        self.lazy.discard(peer)
        self.eager.add(peer)
        for message_id in list(self._cache)[-self.config.max_catch_up_ids :]:
            self._queue_ihave(peer, message_id)

    def neighbour_down(self, peer: bytes) -> None:
        self.eager.discard(peer)
        self.lazy.discard(peer)
        self._pending_ihave.pop(peer, None)

    def _make_eager(self, peer: bytes) -> None:
        if peer in self.lazy:
            self.lazy.discard(peer)
            self.eager.add(peer)

    def _make_lazy(self, peer: bytes) -> None:
        if peer in self.eager:
            self.eager.discard(peer)
            self.lazy.add(peer)

    # -- messages ----------------------------------------------------------------------------
    def on_new_message(self, message_id: bytes, frame: bytes, source: bytes | None) -> None:
        """A message seen for the first time (``source`` None: our own broadcast)."""
        self._cache_message(message_id, frame)
        timer = self._timers.pop(message_id, None)
        if timer is not None:
            timer.cancel()
        self._announcers.pop(message_id, None)
        if source is not None:
            self._make_eager(source)
        for peer in list(self.eager):
            if peer != source:
                self._send(peer, frame)
        for peer in list(self.lazy):
            if peer != source:
                self._queue_ihave(peer, message_id)

    def on_duplicate(self, source: bytes) -> None:
        if self.config.enabled and source in self.eager:
            self._make_lazy(source)
            self._send(source, bytes([FrameKind.PRUNE]))
            self.prunes_sent += 1

    def on_prune(self, source: bytes) -> None:
        if self.config.enabled:
            self._make_lazy(source)

    def on_graft(self, source: bytes, ids: list[bytes]) -> None:
        self._make_eager(source)
        for message_id in ids:
            cached = self._cache.get(message_id)
            if cached is not None:
                self._send(source, cached[1])

    def on_ihave(self, source: bytes, ids: list[bytes]) -> None:
        loop = asyncio.get_running_loop()
        for message_id in ids:
            if self._seen(message_id):
                continue
            announcers = self._announcers.setdefault(message_id, [])
            if source not in announcers:
                announcers.append(source)
            if message_id not in self._timers:
                self._timers[message_id] = loop.call_later(
                    self.config.graft_timeout_s, self._graft, message_id
                )

    def _graft(self, message_id: bytes) -> None:
        """The id was announced but never arrived eagerly: ask an announcer for it."""
        self._timers.pop(message_id, None)
        announcers = self._announcers.get(message_id, [])
        live = [p for p in announcers if p in self.eager or p in self.lazy]
        if self._seen(message_id) or not live:
            self._announcers.pop(message_id, None)
            return
        peer = live[0]
        announcers.remove(peer)
        self._make_eager(peer)
        self._send(peer, encode_ids(FrameKind.GRAFT, [message_id]))
        self.grafts_sent += 1
        if announcers:  # if this one fails to answer, try the next announcer later
            self._timers[message_id] = asyncio.get_running_loop().call_later(
                self.config.graft_timeout_s, self._graft, message_id
            )
        else:
            self._announcers.pop(message_id, None)

    def _queue_ihave(self, peer: bytes, message_id: bytes) -> None:
        self._pending_ihave.setdefault(peer, []).append(message_id)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(
                self.config.ihave_interval_s, self._flush_ihave
            )

    def _flush_ihave(self) -> None:
        self._flush = None
        pending, self._pending_ihave = self._pending_ihave, {}
        for peer, ids in pending.items():
            for start in range(0, len(ids), MAX_IDS_PER_FRAME):
                self._send(
                    peer, encode_ids(FrameKind.IHAVE, ids[start : start + MAX_IDS_PER_FRAME])
                )

    def _cache_message(self, message_id: bytes, frame: bytes) -> None:
        now = time.monotonic()
        self._cache[message_id] = (now, frame)
        horizon = now - self.config.message_cache_s
        while self._cache and (
            len(self._cache) > self.config.max_cached_messages
            or next(iter(self._cache.values()))[0] < horizon
        ):
            self._cache.popitem(last=False)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
