"""Deterministic shuffles: SHA-256 swap-or-not (committees, witnesses) and an LCG
Fisher–Yates (trainer order). Both are portable: a C program reproduces them bit for bit.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import TypeVar

SWAP_OR_NOT_ROUNDS = 90
U64_MASK = (1 << 64) - 1
LCG_MULTIPLIER = 6364136223846793005
LCG_INCREMENT = 1442695040888963407

T = TypeVar("T")


def sha256(*parts: bytes) -> bytes:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.digest()


@lru_cache(maxsize=1024)
def swap_or_not_table(key: bytes, n: int) -> tuple[int, ...]:
    """pos[i] = swap_or_not(i, n, key) for every i < n (a permutation of range(n)).

    For r in 0..89:
        pivot = u64_le(SHA-256(K || [r])[0:8]) % n
        flip  = (pivot + n - i) % n
        p     = max(i, flip)
        h     = SHA-256(K || [r] || u32_le(p // 256))
        if bit (p % 256) of h (byte (p % 256) // 8, LSB first) is set: i = flip
    Cached per (key, n): one election costs 90 hashes (+1 per 256 extra indices).
    """
    if n <= 0:
        return ()
    positions = list(range(n))
    for r in range(SWAP_OR_NOT_ROUNDS):
        round_byte = bytes([r])
        pivot = int.from_bytes(sha256(key, round_byte)[:8], "little") % n
        chunks: dict[int, bytes] = {}
        for slot, i in enumerate(positions):
            flip = (pivot + n - i) % n
            p = max(i, flip)
            chunk = chunks.get(p // 256)
            if chunk is None:
                chunk = sha256(key, round_byte, (p // 256).to_bytes(4, "little"))
                chunks[p // 256] = chunk
            if (chunk[(p % 256) // 8] >> (p % 8)) & 1:
                positions[slot] = flip
    return tuple(positions)


def swap_or_not(index: int, n: int, key: bytes) -> int:
    if not 0 <= index < n:
        raise ValueError(f"index {index} out of range for n={n}")
    return swap_or_not_table(key, n)[index]


class Lcg:
    """state <- state * 6364136223846793005 + 1442695040888963407 (mod 2^64); output = new state."""

    def __init__(self, seed: int):
        self.state = seed & U64_MASK

    def next(self) -> int:
        self.state = (self.state * LCG_MULTIPLIER + LCG_INCREMENT) & U64_MASK
        return self.state


def lcg_shuffle(items: list[T], seed: int) -> list[T]:
    """Fisher–Yates from the end: for i = len-1 .. 1, j = next() % (i + 1), swap items[i], items[j]."""
    shuffled = list(items)
    rng = Lcg(seed)
    for i in range(len(shuffled) - 1, 0, -1):
        j = rng.next() % (i + 1)
        shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
    return shuffled
