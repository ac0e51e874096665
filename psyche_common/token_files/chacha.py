"""A port of Rust's `rand_chacha::ChaCha8Rng::from_seed` + rand 0.8's `SliceRandom::shuffle`.

Psyche shuffles the sequence list of a data set with these (docs/data-and-checkpoints.md,
"Shuffling"), so a faithful
port gives every client (Rust or Python) the same sample for the same index.

ChaCha (D. J. Bernstein) state, 16 little-endian u32 words:

    "expa" "nd 3" "2-by" "te k" | key[0..8] = seed | counter lo, counter hi | stream lo, hi

rand_chacha uses the original 64-bit counter / 64-bit stream layout, stream 0, counter
from 0. A block is 8 rounds (4 double rounds) of quarter rounds

    a += b; d ^= a; d <<<= 16;  c += d; b ^= c; b <<<= 12;
    a += b; d ^= a; d <<<= 8;   c += d; b ^= c; b <<<= 7;

then the input state is added word-wise; next_u32 returns the words in order, block after
block.

rand 0.8.5 shuffle: for i from len-1 down to 1, swap(i, gen_index(i + 1)), where for
bounds that fit in u32, gen_index(n) = gen_range(0..n as u32), sampled as

    range = n; zone = (range << leading_zeros(range)) - 1     (u32 arithmetic)
    loop: v = next_u32(); m = v * range (as u64); if (m mod 2^32) <= zone: return m >> 32
"""

from __future__ import annotations

from collections.abc import MutableSequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")
_CONSTANTS = np.frombuffer(b"expand 32-byte k", dtype="<u4")
_MASK32 = 0xFFFFFFFF


def _rotl(x: np.ndarray, n: int) -> np.ndarray:
    return (x << np.uint32(n)) | (x >> np.uint32(32 - n))


def chacha_blocks(key: bytes, first_block: int, n_blocks: int, rounds: int = 8) -> np.ndarray:
    """Keystream words of blocks first_block .. first_block+n_blocks-1, shape (n_blocks*16,)."""
    if len(key) != 32:
        raise ValueError(f"ChaCha key must be 32 bytes, got {len(key)}")
    counters = np.arange(first_block, first_block + n_blocks, dtype=np.uint64)
    state = np.empty((16, n_blocks), dtype=np.uint32)
    state[0:4] = _CONSTANTS[:, None]
    state[4:12] = np.frombuffer(key, dtype="<u4")[:, None]
    state[12] = (counters & np.uint64(_MASK32)).astype(np.uint32)
    state[13] = (counters >> np.uint64(32)).astype(np.uint32)
    state[14:16] = 0
    x = [state[i].copy() for i in range(16)]

    def quarter(a: int, b: int, c: int, d: int) -> None:
        x[a] += x[b]; x[d] = _rotl(x[d] ^ x[a], 16)  # noqa: E702
        x[c] += x[d]; x[b] = _rotl(x[b] ^ x[c], 12)  # noqa: E702
        x[a] += x[b]; x[d] = _rotl(x[d] ^ x[a], 8)  # noqa: E702
        x[c] += x[d]; x[b] = _rotl(x[b] ^ x[c], 7)  # noqa: E702

    with np.errstate(over="ignore"):
        for _ in range(rounds // 2):
            quarter(0, 4, 8, 12); quarter(1, 5, 9, 13)  # noqa: E702
            quarter(2, 6, 10, 14); quarter(3, 7, 11, 15)  # noqa: E702
            quarter(0, 5, 10, 15); quarter(1, 6, 11, 12)  # noqa: E702
            quarter(2, 7, 8, 13); quarter(3, 4, 9, 14)  # noqa: E702
        out = np.stack(x) + state
    return out.T.reshape(-1)


class ChaChaRng:
    """rand_chacha's ChaChaXRng::from_seed: a stream of u32 words (ChaCha8 by default)."""

    _BATCH_BLOCKS = 256

    def __init__(self, seed: bytes, rounds: int = 8) -> None:
        if len(seed) != 32:
            raise ValueError(f"seed must be 32 bytes, got {len(seed)}")
        self._key = bytes(seed)
        self._rounds = rounds
        self._next_block = 0
        self._words: list[int] = []
        self._pos = 0

    def next_u32(self) -> int:
        if self._pos >= len(self._words):
            words = chacha_blocks(self._key, self._next_block, self._BATCH_BLOCKS, self._rounds)
            self._words = words.tolist()
            self._next_block += self._BATCH_BLOCKS
            self._pos = 0
        word = self._words[self._pos]
        self._pos += 1
        return word

    def gen_index(self, bound: int) -> int:
        """rand 0.8 gen_range(0..bound) for a u32 bound (widening-multiply rejection)."""
        if not 0 < bound <= _MASK32:
            raise ValueError(f"bound must be in 1..2^32-1, got {bound}")
        zone = ((bound << (32 - bound.bit_length())) & _MASK32) - 1
        while True:
            product = self.next_u32() * bound
            if (product & _MASK32) <= zone:
                return product >> 32


def shuffle_in_place(items: MutableSequence[T], seed: bytes) -> None:
    """rand 0.8 `items.shuffle(&mut ChaCha8Rng::from_seed(seed))`."""
    rng = ChaChaRng(seed)
    for i in range(len(items) - 1, 0, -1):
        j = rng.gen_index(i + 1)
        items[i], items[j] = items[j], items[i]
