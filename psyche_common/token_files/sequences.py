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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from coordinator.config import DontShuffle, SeededShuffle, TokenSize
from psyche_common.token_files.chacha import shuffle_in_place

TOKEN_FILE_EXTENSIONS = (".ds", ".bin", ".npy")


class DataProviderError(RuntimeError):
    """Data cannot be provided: missing or short file, bad index, server failure."""


@dataclass(frozen=True)
class SequenceRef:
    file_index: int
    byte_offset: int


def sample_offsets(size: int, sample_bytes: int, reserve_bytes: int) -> range:
    """Byte offsets of the samples of one file (see module docstring)."""
    return range(0, max(size - sample_bytes - reserve_bytes, 0), sample_bytes)


def build_sequence_index(
    file_sizes: Sequence[int],
    sample_bytes: int,
    reserve_bytes: int,
    shuffle: DontShuffle | SeededShuffle,
) -> list[SequenceRef]:
    """All samples of all files in order, then shuffled if the shuffle is Seeded."""
    refs = [
        SequenceRef(file_index, offset)
        for file_index, size in enumerate(file_sizes)
        for offset in sample_offsets(size, sample_bytes, reserve_bytes)
    ]
    if isinstance(shuffle, SeededShuffle):
        shuffle_in_place(refs, shuffle.seed)
    return refs


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
