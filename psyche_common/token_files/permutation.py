"""The Seeded shuffle of a whole sequence index, as a permutation array.

    shuffle_permutation(length, seed) -> int64 array p    p = shuffle_in_place(list(range(length)), seed)
    swap_targets(length, seed) -> int64 array k           the k of rand's swap(i, k), for each i
    draw_swap_targets(length, KeyStream(seed)) -> (k, words drawn)

chacha.py `shuffle_in_place` is the reference port of rand 0.9's slice shuffle (one Python
step per item, checked against the Rust vectors). This module draws the same swaps with
numpy, so a 500 k-sequence index is permuted in a fraction of the time:

- the chunk schedule (which position starts a chunk, its bound, its digit count) depends
  on the positions only; from position 65535 on (bound (n)(n+1) > u32::MAX for n >= 65536)
  every chunk is one digit with bound i+1, so those are an arange;
- Canon's method draws a second word only when the first product's low half is in the top
  `bound` values; a window of chunks is drawn one word each, up to the first that needs a
  second word, which shifts the words of all later chunks by one, so the next window starts
  after it (at 500 k sequences the r = 1 region has ~30 such chunks in all);
- the multi-digit chunks before position 65535 (at most ~33 k) are drawn and split in a
  plain loop, as in the reference.

The swaps themselves stay sequential (each depends on the previous ones); they run as the
"inside-out" form of the same pass over a list of ints: before step i position i still holds
i, so swap(i, k) is `order[i] = order[k]; order[k] = i`.
"""

from __future__ import annotations

import numpy as np

from psyche_common.token_files.chacha import MASK32, chacha_blocks, chunk_bound

_ONE_DIGIT_FROM = 65536  # n from which chunk_bound(n) has a single factor
_WINDOW = 8192  # chunks drawn per vectorised step


class KeyStream:
    """The ChaCha8 word stream of a seed (ChaChaRng's words), grown on demand as an array."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) != 32:
            raise ValueError(f"seed must be 32 bytes, got {len(seed)}")
        self._seed = bytes(seed)
        self._words = np.empty(0, dtype=np.uint32)

    def words(self, start: int, count: int) -> np.ndarray:
        have = len(self._words)
        if start + count > have:
            blocks = max((start + count - have + 15) // 16, have // 16, 64)
            more = chacha_blocks(self._seed, have // 16, blocks)
            self._words = np.concatenate([self._words, more])
        return self._words[start : start + count]


def _multi_digit_targets(stream: KeyStream, targets: np.ndarray, end: int) -> tuple[int, int]:
    """Fill targets[1:] for the chunks starting below min(end, 65535), as the reference does;
    returns (the first position not filled, the words used)."""
    schedule = []
    position = 1
    while position < end and position + 1 < _ONE_DIGIT_FROM:
        bound, digits = chunk_bound(position + 1)
        schedule.append((position, bound, digits))
        position += digits
    words = stream.words(0, 2 * len(schedule) + 1).tolist()
    used = 0
    for start, bound, digits in schedule:
        product = words[used] * bound
        used += 1
        chunk, low = product >> 32, product & MASK32
        if low > (1 << 32) - bound:
            chunk += (low + ((words[used] * bound) >> 32)) >> 32
            used += 1
        for i in range(start, min(start + digits, end)):
            targets[i] = chunk % (i + 1)  # the last digit is the remaining chunk itself
            chunk //= i + 1
    return min(position, end), used


def swap_targets(length: int, seed: bytes) -> np.ndarray:
    """k_i of rand 0.9's `shuffle` with ChaCha8Rng::from_seed(seed): step i swaps i and k_i."""
    return draw_swap_targets(length, KeyStream(seed))[0]


def draw_swap_targets(length: int, stream: KeyStream) -> tuple[np.ndarray, int]:
    """swap_targets from `stream`, and how many of its words the shuffle drew."""
    if length >= MASK32:
        raise ValueError(f"cannot shuffle {length} items: rand's u64 path is not ported")
    targets = np.zeros(max(length, 0), dtype=np.int64)
    if length <= 1:
        return targets, 0  # rand returns early: no word is drawn
    position, used = _multi_digit_targets(stream, targets, length)
    # One-digit chunks: the chunk drawn for position i is below i+1 and is k_i itself.
    bounds = np.arange(position + 1, length + 1, dtype=np.uint64)
    done = 0
    while done < len(bounds):
        size = min(_WINDOW, len(bounds) - done)
        words = stream.words(used, size + 1).astype(np.uint64)
        bound = bounds[done : done + size]
        product = words[:size] * bound
        high, low = product >> np.uint64(32), product & np.uint64(MASK32)
        second = np.flatnonzero(low > np.uint64(1 << 32) - bound)
        clean = int(second[0]) if second.size else size
        targets[position + done : position + done + clean] = high[:clean]
        done, used = done + clean, used + clean
        if clean < size:  # this chunk takes a second word; later ones shift by one
            b, lo = int(bound[clean]), int(low[clean])
            carry = (int(words[clean + 1]) * b) >> 32
            targets[position + done] = int(high[clean]) + ((lo + carry) >> 32)
            done, used = done + 1, used + 2
    return targets, used


def shuffle_permutation(length: int, seed: bytes) -> np.ndarray:
    """The order rand 0.9's `shuffle` leaves 0..length-1 in (int64): item p[j] lands at j."""
    order = [0] * length
    for i, k in enumerate(swap_targets(length, seed).tolist()):
        order[i] = order[k]
        order[k] = i
    return np.array(order, dtype=np.int64)


__all__ = ["KeyStream", "draw_swap_targets", "shuffle_permutation", "swap_targets"]
