"""Content-addressed in-memory blob store (BLAKE3), with tags for garbage collection.

A blob lives while at least one tag holds it. Psyche's tags, which the
runtime is expected to use: ``distro-result_{step}``,
``downloaded-distro-result-{peer}_{step}``, ``model-{param}``, ``model-config``;
``remove_steps_before(step)`` drops every ``*_{n}`` tag with ``n < step``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import blake3

HASH_BYTES = 32
_STEP_TAG = re.compile(r"^(?P<kind>.+)_(?P<step>\d+)$")


def blob_hash(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


def step_tag(kind: str, step: int) -> str:
    return f"{kind}_{step}"


class BlobStore:
    def __init__(self) -> None:
        self._blobs: dict[bytes, bytes] = {}
        self._tags: dict[str, set[bytes]] = {}

    def add(self, data: bytes, tag: str = "untagged") -> bytes:
        """Store ``data`` under ``tag``; returns its BLAKE3 hash (32 bytes)."""
        digest = blob_hash(data)
        self._blobs.setdefault(digest, bytes(data))
        self._tags.setdefault(tag, set()).add(digest)
        return digest

    def get(self, digest: bytes) -> bytes | None:
        return self._blobs.get(digest)

    def __contains__(self, digest: object) -> bool:
        return digest in self._blobs

    def __len__(self) -> int:
        return len(self._blobs)

    @property
    def total_bytes(self) -> int:
        return sum(len(b) for b in self._blobs.values())

    def tags(self) -> list[str]:
        return sorted(self._tags)

    def remove_tag(self, tag: str) -> int:
        """Drop ``tag``; returns how many blobs were freed (no other tag held them)."""
        return self.remove_tags_where(lambda t: t == tag)

    def remove_steps_before(self, step: int) -> int:
        def older(tag: str) -> bool:
            match = _STEP_TAG.match(tag)
            return match is not None and int(match["step"]) < step

        return self.remove_tags_where(older)

    def remove_tags_where(self, predicate: Callable[[str], bool]) -> int:
        for tag in [t for t in self._tags if predicate(t)]:
            del self._tags[tag]
        held = set().union(*self._tags.values()) if self._tags else set()
        orphans = [d for d in self._blobs if d not in held]
        for digest in orphans:
            del self._blobs[digest]
        return len(orphans)
