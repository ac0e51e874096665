"""Witness bloom filter: 1024 bits in 16 u64 words + 8 keys (docs/coordinator.md,
"Bloom filters").

Position of an item under key k:  fnv1a64_k(item) % 1024 with
    h = k;  for byte b in item: h = (h XOR b) * 0x100000001b3  (mod 2^64)
Bit i lives in word i // 64, LSB first. The keys travel with the filter; clients
pick them at random, the coordinator only reads them.
(Psyche hashes through Rust's `Hash` trait; we define the item as its raw bytes.)
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.limits import BLOOM_KEYS, BLOOM_WORDS

BLOOM_BITS = BLOOM_WORDS * 64
FNV_PRIME = 0x100000001B3
U64_MASK = (1 << 64) - 1


def fnv1a64(key: int, data: bytes) -> int:
    h = key
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & U64_MASK
    return h


@dataclass(slots=True)
class Bloom:
    keys: tuple[int, ...] = (0,) * BLOOM_KEYS
    bits: int = 0  # the 1024-bit set as one integer; bit i = word i//64, bit i%64

    def __post_init__(self) -> None:
        if len(self.keys) != BLOOM_KEYS or not all(0 <= k <= U64_MASK for k in self.keys):
            raise ValueError(f"a bloom filter needs {BLOOM_KEYS} u64 keys")
        if not 0 <= self.bits < 1 << BLOOM_BITS:
            raise ValueError(f"a bloom filter has {BLOOM_BITS} bits")

    def _positions(self, item: bytes) -> list[int]:
        return [fnv1a64(key, item) % BLOOM_BITS for key in self.keys]

    def add(self, item: bytes) -> None:
        for position in self._positions(item):
            self.bits |= 1 << position

    def contains(self, item: bytes) -> bool:
        return all((self.bits >> position) & 1 for position in self._positions(item))

    @property
    def words(self) -> list[int]:
        return [(self.bits >> (64 * w)) & U64_MASK for w in range(BLOOM_WORDS)]

    @classmethod
    def from_words(cls, words: list[int], keys: tuple[int, ...]) -> Bloom:
        if len(words) != BLOOM_WORDS:
            raise ValueError(f"a bloom filter has {BLOOM_WORDS} words")
        return cls(keys=tuple(keys), bits=sum(w << (64 * i) for i, w in enumerate(words)))
