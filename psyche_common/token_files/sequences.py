"""The sequence index shared by all token-file providers
(docs/data-and-checkpoints.md, "Token files and the sequence index").

Token files (`.ds`, `.bin`, `.npy`) are raw little-endian tokens with no header: TwoBytes =
u16, FourBytes = u32. A sample is exactly max_seq_len = S tokens; samples sit back to back
without overlap. With B = S * token_size bytes per sample, a file of `size` bytes holds
samples at byte offsets

    Local:  0, B, 2B, ...  while offset < size - B
    HTTP:   0, B, 2B, ...  while offset < size - B - token_size   (one token reserved)

(so a local file of exactly n*B bytes yields n-1 samples, as in Psyche). The samples of
all files are concatenated in file order and, for a Seeded shuffle, permuted with
ChaCha8 + rand's slice shuffle. Data index n is sequences[n]; a batch id [a, b] is the
indices a..b inclusive.

    build_sequence_index(sizes, B, reserve, shuffle) -> SequenceIndex
    SequenceIndex.file_index / .byte_offset      int64 arrays, one entry per data index
    SequenceIndex.batch(a, b) -> (files, offsets)  the entries of a..b (views)
    adjacent_runs(files, offsets, B)              (file, offset, count) of contiguous samples

The index is two int64 arrays (16 bytes a sequence, 8 MB for 500 k), built with one
arange over all samples and permuted with permutation.py `shuffle_permutation` (the same
order as chacha.py's reference shuffle), never a Python object per sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from coordinator.config import DontShuffle, SeededShuffle, TokenSize
from psyche_common.token_files.permutation import shuffle_permutation

TOKEN_FILE_EXTENSIONS = (".ds", ".bin", ".npy")


class DataProviderError(RuntimeError):
    """Data cannot be provided: missing or short file, bad index, server failure."""


@dataclass(frozen=True)
class SequenceIndex:
    """Data index n is sample byte_offset[n] of file file_index[n] (both int64)."""

    file_index: np.ndarray
    byte_offset: np.ndarray

    def __len__(self) -> int:
        return len(self.file_index)

    @property
    def nbytes(self) -> int:
        return int(self.file_index.nbytes + self.byte_offset.nbytes)

    def batch(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """(files, offsets) of data indices start..end inclusive (check_batch first)."""
        return self.file_index[start : end + 1], self.byte_offset[start : end + 1]


def samples_per_file(file_sizes: Sequence[int], sample_bytes: int, reserve_bytes: int) -> np.ndarray:
    """How many samples each file holds: offsets 0, B, 2B, ... below size - B - reserve."""
    limits = np.maximum(np.asarray(file_sizes, dtype=np.int64) - sample_bytes - reserve_bytes, 0)
    return (limits + sample_bytes - 1) // sample_bytes


def build_sequence_index(
    file_sizes: Sequence[int],
    sample_bytes: int,
    reserve_bytes: int,
    shuffle: DontShuffle | SeededShuffle,
) -> SequenceIndex:
    """All samples of all files in order, then shuffled if the shuffle is Seeded."""
    counts = samples_per_file(file_sizes, sample_bytes, reserve_bytes)
    file_index = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    first_of_file = np.repeat(np.cumsum(counts) - counts, counts)
    byte_offset = (np.arange(len(file_index), dtype=np.int64) - first_of_file) * sample_bytes
    if isinstance(shuffle, SeededShuffle):
        order = shuffle_permutation(len(file_index), shuffle.seed)
        file_index, byte_offset = file_index[order], byte_offset[order]
    return SequenceIndex(file_index, byte_offset)


def adjacent_runs(files: np.ndarray, offsets: np.ndarray,
                  sample_bytes: int) -> list[tuple[int, int, int]]:
    """(file index, byte offset, sample count) for maximal runs of consecutive samples, so
    a remote reader asks for each run with one range request."""
    if len(files) == 0:
        return []
    breaks = np.flatnonzero((files[1:] != files[:-1])
                            | (offsets[1:] != offsets[:-1] + sample_bytes)) + 1
    firsts = np.concatenate([[0], breaks])
    counts = np.diff(np.concatenate([firsts, [len(files)]]))
    return list(zip(files[firsts].tolist(), offsets[firsts].tolist(), counts.tolist(), strict=True))


def check_batch(start: int, end: int, num_sequences: int) -> None:
    """A batch id [start, end] (inclusive) must lie inside the data set."""
    if start < 0 or end < start:
        raise DataProviderError(f"bad batch id [{start}, {end}]: need 0 <= start <= end")
    if end >= num_sequences:
        raise DataProviderError(
            f"batch id [{start}, {end}] out of range: the data set has {num_sequences} sequences"
        )


def tokens_to_tensor(raw: bytes, token_size: TokenSize, max_seq_len: int) -> torch.Tensor:
    """Little-endian u16/u32 bytes -> int64 tensor [n, max_seq_len] (int64: embedding ids)."""
    dtype = "<u2" if token_size is TokenSize.TwoBytes else "<u4"
    tokens = np.frombuffer(raw, dtype=dtype).astype(np.int64)
    return torch.from_numpy(tokens.reshape(-1, max_seq_len))
