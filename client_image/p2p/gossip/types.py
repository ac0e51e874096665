"""Gossip configuration, counters, delivered messages and per-neighbour state."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import iroh

from client_image.p2p import framing


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
    # True: PlumTree, eager push on a tree and IHAVE/GRAFT on the other edges (see
    # tree.py): fewer copies, but with every node broadcasting at once the shared tree
    # is over-pruned and grafts add graft_timeout_s. Measured with bench/p2p.py, 16 nodes:
    # flooding the bounded active view had the lower p99, for ~3x the copies of messages
    # that are < 1 KiB, so flooding is the default.
    lazy_push: bool = False
    graft_timeout_s: float = 0.2
    ihave_interval_s: float = 0.05
    message_cache_s: float = 60.0


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
    grafts: int = 0
    prunes: int = 0


@dataclass(frozen=True)
class GossipMessage:
    sender: bytes
    payload: bytes
    message_id: bytes


@dataclass
class Neighbour:
    peer: bytes
    send: iroh.SendStream
    recv: iroh.RecvStream
    outbox: asyncio.Queue[bytes]
    dialled_by_us: bool
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def write_loop(self) -> None:
        while True:
            frames = [await self.outbox.get()]
            while not self.outbox.empty():  # coalesce a burst into one binding call
                frames.append(self.outbox.get_nowait())
            await self.send.write_all(b"".join(framing.encode_frame(f) for f in frames))


async def finish_quietly(send: iroh.SendStream) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(send.finish(), 1.0)
