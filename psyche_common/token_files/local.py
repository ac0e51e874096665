"""Local data provider: every token file of a directory, read through memory maps.

    LocalDataProvider(path, max_seq_len, token_size, shuffle)
        .num_sequences, .get_samples(start, end) -> Tensor, await .fetch(start, end)

Each file is mapped (np.memmap) as a [samples, max_seq_len] array of its tokens, so a
batch is one fancy-index read per file it touches: the OS pages in only the samples asked
for, and nothing of a file is read when the provider opens.
"""

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
    samples_per_file,
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
        self._index = build_sequence_index(sizes, sample_bytes, 0, shuffle or DontShuffle())
        dtype = "<u2" if token_size is TokenSize.TwoBytes else "<u4"
        # Sample offsets are multiples of the sample size from 0, so row = offset // B; the
        # shape stops before the bytes no sample uses (the tail the offset rule leaves).
        self._rows = [
            np.memmap(p, dtype=dtype, mode="r", shape=(int(count), max_seq_len))
            for p, count in zip(self.files, samples_per_file(sizes, sample_bytes, 0), strict=True)
        ]

    @property
    def num_sequences(self) -> int:
        return len(self._index)

    def get_samples(self, start: int, end: int) -> torch.Tensor:
        """Samples start..end (inclusive) as an int64 tensor [end - start + 1, max_seq_len]."""
        check_batch(start, end, self.num_sequences)
        files, offsets = self._index.batch(start, end)
        rows = offsets // self._sample_bytes
        out = np.empty((len(files), self.max_seq_len), dtype=np.int64)
        for file_index in np.unique(files).tolist():
            wanted = files == file_index
            out[wanted] = self._rows[file_index][rows[wanted]]
        return torch.from_numpy(out)

    async def fetch(self, start: int, end: int) -> torch.Tensor:
        """get_samples off the event loop."""
        return await asyncio.to_thread(self.get_samples, start, end)
