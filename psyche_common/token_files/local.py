"""Local data provider: every token file of a directory, read through memory maps."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import torch

from coordinator.config import DontShuffle, SeededShuffle, TokenSize
from psyche_common.token_files.sequences import (
    TOKEN_FILE_EXTENSIONS,
    DataProviderError,
    build_sequence_index,
    check_batch,
    tokens_to_tensor,
)


class LocalDataProvider:
    """Samples of the `.ds`/`.bin`/`.npy` files of a directory, in file-name order.

    A file whose size is not a whole number of tokens, or too short to hold one sample,
    is an error (it is almost certainly truncated), as is a directory without token files.
    """

    def __init__(
        self,
        path: str | Path,
        max_seq_len: int,
        token_size: TokenSize = TokenSize.TwoBytes,
        shuffle: DontShuffle | SeededShuffle | None = None,
    ) -> None:
        if max_seq_len < 1:
            raise DataProviderError(f"max_seq_len must be >= 1, got {max_seq_len}")
        root = Path(path)
        if not root.is_dir():
            raise DataProviderError(f"data directory {root} does not exist")
        self.files = sorted(p for p in root.iterdir() if p.suffix in TOKEN_FILE_EXTENSIONS)
        if not self.files:
            raise DataProviderError(
                f"data directory {root} has no token files ({', '.join(TOKEN_FILE_EXTENSIONS)})"
            )
        self.max_seq_len = max_seq_len
        self.token_size = token_size
        sample_bytes = max_seq_len * token_size.nbytes
        sizes = [p.stat().st_size for p in self.files]
        for file, size in zip(self.files, sizes, strict=True):
            if size % token_size.nbytes:
                raise DataProviderError(
                    f"{file}: {size} bytes is not a whole number of {token_size.nbytes}-byte tokens"
                )
            if size <= sample_bytes:
                raise DataProviderError(
                    f"{file}: short file, {size // token_size.nbytes} tokens cannot hold one "
                    f"sample of {max_seq_len} tokens"
                )
        self._sample_bytes = sample_bytes
        self._sequences = build_sequence_index(sizes, sample_bytes, 0, shuffle or DontShuffle())
        dtype = np.uint8
        self._maps = [np.memmap(p, dtype=dtype, mode="r") for p in self.files]

    @property
    def num_sequences(self) -> int:
        return len(self._sequences)

    def get_samples(self, start: int, end: int) -> torch.Tensor:
        """Samples start..end (inclusive) as an int64 tensor [end - start + 1, max_seq_len]."""
        check_batch(start, end, self.num_sequences)
        chunks = []
        for ref in self._sequences[start : end + 1]:
            data = self._maps[ref.file_index]
            chunks.append(bytes(data[ref.byte_offset : ref.byte_offset + self._sample_bytes]))
        return tokens_to_tensor(b"".join(chunks), self.token_size, self.max_seq_len)

    async def fetch(self, start: int, end: int) -> torch.Tensor:
        """get_samples off the event loop."""
        return await asyncio.to_thread(self.get_samples, start, end)
