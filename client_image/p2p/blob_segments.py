"""Byte ranges of a blob being downloaded, one per parallel stream, hashed as they arrive."""

from __future__ import annotations

from dataclasses import dataclass

import blake3


@dataclass
class Segment:
    """Bytes [start, end) of a blob; one segment per parallel stream."""

    start: int
    end: int
    data: bytearray
    hasher: blake3.blake3 | None  # incremental hash when the segment is the whole blob

    @property
    def next_offset(self) -> int:
        return self.start + len(self.data)

    @property
    def missing(self) -> int:
        return self.end - self.next_offset

    @property
    def complete(self) -> bool:
        return self.missing == 0

    def append(self, chunk: bytes) -> None:
        self.data += chunk
        if self.hasher is not None:
            self.hasher.update(chunk)


def split(size: int, count: int) -> list[Segment]:
    bounds = [size * i // count for i in range(count + 1)]
    whole = count == 1
    return [
        Segment(bounds[i], bounds[i + 1], bytearray(), blake3.blake3() if whole else None)
        for i in range(count)
    ]


def digest_of(segments: list[Segment]) -> bytes:
    if len(segments) == 1 and segments[0].hasher is not None:
        return segments[0].hasher.digest()
    # parallel segments arrive out of order: hash the assembled blob (multithreaded BLAKE3)
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for segment in segments:
        hasher.update(segment.data)
    return hasher.digest()
