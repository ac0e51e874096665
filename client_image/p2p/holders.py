"""Who holds which blob, and whether to serve a request or send the asker elsewhere.

A training result is content-addressed, so any node that has downloaded and
verified it can serve it. Each node keeps a small book per blob hash:

- the nodes it served the whole blob to (its downstream: they hold it now),
- the holders other nodes redirected it to (hints for its own download),
- how many uploads of the blob were started and how many are running.

Serving policy (only for askers that accept a redirect): serve while fewer
than ``serve_budget`` uploads of that blob were started; after that, redirect
the asker to a few of its downstream (the ones redirected to least, so load
spreads: each has its own budget, unlike the nodes that sent us here); with
no downstream to point to yet, serve if fewer than ``max_active`` uploads
run, else answer busy. A producer therefore uploads each result about
``serve_budget`` times whatever the swarm size, and the blob spreads as a tree
whose every node uploads it at most ``serve_budget`` times.

The book is bounded (``max_blobs`` hashes, least recently used forgotten;
``max_holders`` per hash) and ``retain`` drops the hashes a step no longer needs.
"""

from __future__ import annotations

import contextlib
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

Decision = Literal["serve", "busy"] | list[bytes]  # a list: redirect to these holders


@dataclass(frozen=True)
class HolderPolicy:
    serve_budget: int = 2
    max_active: int = 2
    redirect_fanout: int = 3
    max_holders: int = 32
    max_blobs: int = 4096
    speed_smoothing: float = 0.3  # weight of the newest sample in a peer's moving average

    def __post_init__(self) -> None:
        if min(self.serve_budget, self.max_active, self.redirect_fanout) < 1:
            raise ValueError("serve_budget, max_active and redirect_fanout must be at least 1")
        if self.max_holders < self.redirect_fanout or self.max_blobs < 1:
            raise ValueError("max_holders must be >= redirect_fanout and max_blobs >= 1")


@dataclass
class _BlobEntry:
    # served by us -> how often we redirected someone to it
    downstream: dict[bytes, int] = field(default_factory=dict)
    hints: dict[bytes, None] = field(default_factory=dict)  # holders others pointed us to
    started: int = 0
    active: int = 0
    bytes_sent: int = 0


@dataclass
class ServeStats:
    """What this node's blob server did (the swarm bench reads it)."""

    bytes_sent: int = 0
    uploads: int = 0
    redirects: int = 0
    busy: int = 0


class HolderBook:
    def __init__(self, policy: HolderPolicy | None = None) -> None:
        self.policy = policy or HolderPolicy()
        self.stats = ServeStats()
        self._blobs: OrderedDict[bytes, _BlobEntry] = OrderedDict()
        self._seconds_per_fetch: dict[bytes, float] = {}

    def _entry(self, digest: bytes) -> _BlobEntry:
        entry = self._blobs.get(digest)
        if entry is None:
            entry = self._blobs[digest] = _BlobEntry()
            while len(self._blobs) > self.policy.max_blobs:
                self._blobs.popitem(last=False)
        else:
            self._blobs.move_to_end(digest)
        return entry

    # -- what we know about holders -------------------------------------------------------
    def learn(self, digest: bytes, holders: Iterable[bytes]) -> None:
        entry = self._entry(digest)
        for holder in holders:
            if len(entry.hints) < self.policy.max_holders:
                entry.hints[holder] = None

    def forget_holder(self, digest: bytes, holder: bytes) -> None:
        """``holder`` failed us for ``digest`` (wrong bytes, gone): never point anyone to it."""
        entry = self._blobs.get(digest)
        if entry is not None:
            entry.hints.pop(holder, None)
            entry.downstream.pop(holder, None)

    def holders_of(self, digest: bytes) -> list[bytes]:
        entry = self._blobs.get(digest)
        return list(dict.fromkeys([*entry.hints, *entry.downstream])) if entry else []

    def bytes_sent(self, digest: bytes) -> int:
        """Bytes of ``digest`` this node has uploaded (while the book remembers it)."""
        entry = self._blobs.get(digest)
        return entry.bytes_sent if entry else 0

    def retain(self, keep: Callable[[bytes], bool]) -> None:
        for digest in [d for d in self._blobs if not keep(d)]:
            del self._blobs[digest]

    # -- peer speed (prefer fast holders, with randomness so load still spreads) -------------
    def record_fetch(self, peer: bytes, seconds: float) -> None:
        previous = self._seconds_per_fetch.get(peer)
        weight = self.policy.speed_smoothing
        self._seconds_per_fetch[peer] = (
            seconds if previous is None else (1 - weight) * previous + weight * seconds
        )
        if len(self._seconds_per_fetch) > self.policy.max_blobs:  # bounded like the book
            self._seconds_per_fetch.pop(next(iter(self._seconds_per_fetch)))

    def by_speed(self, peers: Iterable[bytes]) -> list[bytes]:
        """Faster peers first; unknown ones rank as the median; jitter ×U(0.5, 1.5)."""
        peers = list(dict.fromkeys(peers))
        known = sorted(self._seconds_per_fetch.get(p, 0.0) for p in peers)
        median = known[len(known) // 2] if known else 0.0
        return sorted(
            peers,
            key=lambda p: self._seconds_per_fetch.get(p, median) * random.uniform(0.5, 1.5),
        )

    # -- serving ---------------------------------------------------------------------------
    def decide(self, digest: bytes, requester: bytes) -> Decision:
        entry = self._entry(digest)
        if entry.started < self.policy.serve_budget:
            return "serve"
        candidates = [h for h in entry.downstream if h != requester]
        if candidates:
            random.shuffle(candidates)  # ties between equally used holders go at random
            chosen = sorted(candidates, key=lambda h: entry.downstream[h])
            chosen = chosen[: self.policy.redirect_fanout]
            for holder in chosen:
                entry.downstream[holder] += 1
            self.stats.redirects += 1
            return chosen
        if entry.active < self.policy.max_active:
            return "serve"
        self.stats.busy += 1
        return "busy"

    @contextlib.contextmanager
    def uploading(self, digest: bytes) -> Iterator[None]:
        entry = self._entry(digest)
        entry.started += 1
        entry.active += 1
        try:
            yield
        finally:
            entry.active -= 1

    def served(self, digest: bytes, requester: bytes, size: int, *, now_holds: bool) -> None:
        """An upload of ``size`` bytes of ``digest`` completed; ``now_holds``: it was the
        whole blob to an asker that serves results on (a redirectable request)."""
        self.stats.uploads += 1
        self.stats.bytes_sent += size
        entry = self._entry(digest)
        entry.bytes_sent += size
        if now_holds and len(entry.downstream) < self.policy.max_holders:
            entry.downstream.setdefault(requester, 0)
