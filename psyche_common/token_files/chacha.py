"""A port of Rust's `rand_chacha::ChaCha8Rng::from_seed` + rand 0.9's `SliceRandom::shuffle`.

Psyche (rand 0.9.2, rand_chacha 0.9.0) shuffles the sequence list of a data set with these
(docs/data-and-checkpoints.md, "Shuffling"), so a faithful port gives every client (Rust or
Python) the same sample for the same index. tests/data/rand_shuffle_vectors.json holds
results of the real Rust functions.

ChaCha (D. J. Bernstein) state, 16 little-endian u32 words:

    "expa" "nd 3" "2-by" "te k" | key[0..8] = seed | counter lo, counter hi | stream lo, hi

rand_chacha uses the original 64-bit counter / 64-bit stream layout, stream 0, counter
from 0. A block is 8 rounds (4 double rounds) of quarter rounds

    a += b; d ^= a; d <<<= 16;  c += d; b ^= c; b <<<= 12;
    a += b; d ^= a; d <<<= 8;   c += d; b ^= c; b <<<= 7;

then the input state is added word-wise; next_u32 returns the words in order, block after
block.

rand 0.9 shuffle (slices shorter than u32::MAX): a Fisher-Yates pass *upwards*, for i in
0..len swap(i, k) with k uniform in 0..=i, where the k are drawn by `IncreasingUniform`:
one random u32 `chunk` below bound = (n+1)(n+2)...(n+r), the longest such product that
fits in a u32 (r = 11 for the first chunk, n = 1), is split into r digits in mixed radix,
the least significant digit first:

    k = chunk % (n+1); chunk //= (n+1); n += 1        (the last digit of a chunk is chunk itself)

k for i = 0 is 0 without a draw. The chunk is `random_range(..bound)`, Canon's method
(without rand's `unbiased` feature, which no Psyche manifest enables):

    m = next_u32() * bound (as u64); result = m >> 32; lo = m mod 2^32
    if lo > 2^32 - bound:  result += 1 if lo + ((next_u32() * bound) >> 32) >= 2^32

rand 0.8 (swap downwards, one rejection-sampled draw per position) gives other orders
for any list of more than two items.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")
_CONSTANTS = np.frombuffer(b"expand 32-byte k", dtype="<u4")
MASK32 = 0xFFFFFFFF


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
    state[12] = (counters & np.uint64(MASK32)).astype(np.uint32)
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

    def random_below(self, bound: int) -> int:
        """rand 0.9 `random_range(..bound)` for a u32 bound: Canon's method as built without
        the `unbiased` feature (Psyche's build). The second word is drawn only when the first
        product's low half lies in the top `bound` values; the `unbiased` loop would draw
        differently and shift every later index.
        """
        if not 0 < bound <= MASK32:
            raise ValueError(f"bound must be in 1..2^32-1, got {bound}")
        product = self.next_u32() * bound
        result, low = product >> 32, product & MASK32
        if low > (1 << 32) - bound:
            carry = (self.next_u32() * bound) >> 32
            result += (low + carry) >> 32
        return result


def chunk_bound(n: int) -> tuple[int, int]:
    """rand's `calculate_bound_u32(n)`: (n * (n+1) * ... * (n+r-1), r) with r the most
    factors whose product fits in a u32 (at least one)."""
    product, factor = n, n + 1
    while product * factor <= MASK32:
        product *= factor
        factor += 1
    return product, factor - n


def shuffle_with_rng(items: MutableSequence[T], rng: ChaChaRng) -> None:
    """rand 0.9 `items.shuffle(rng)` (SliceRandom::shuffle = partial_shuffle(len))."""
    length = len(items)
    if length <= 1:
        return  # rand returns early: no word is drawn
    if length >= MASK32:
        # rand switches to one `random_range(..i + 1)` per usize index here; no Python list
        # of 4 billion sequences is practical, so that branch is not ported.
        raise ValueError(f"cannot shuffle {length} items: rand's u64 path is not ported")
    # IncreasingUniform state: the next index is drawn from 0..=n; starting at n = 0 its
    # first index is 0 and costs no draw (chunk_remaining = 1).
    n, chunk, chunk_remaining = 0, 0, 1
    for i in range(length):
        next_n = n + 1
        if chunk_remaining == 0:
            bound, chunk_remaining = chunk_bound(next_n)
            chunk = rng.random_below(bound)
        chunk_remaining -= 1
        if chunk_remaining == 0:
            index = chunk  # the last digit: chunk is already below next_n
        else:
            index = chunk % next_n
            chunk //= next_n
        n = next_n
        items[i], items[index] = items[index], items[i]


def shuffle_in_place(items: MutableSequence[T], seed: bytes) -> None:
    """rand 0.9 `items.shuffle(&mut ChaCha8Rng::from_seed(seed))`."""
    shuffle_with_rng(items, ChaChaRng(seed))
