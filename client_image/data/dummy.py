"""Dummy data provider: Psyche's `Dummy` data location, synthetic tokens for tests.

Psyche's client (shared/data-provider/src/dummy.rs, opened by shared/client's init with
TokenSize::TwoBytes and u64::MAX sequences) serves all-zero tokens for every index. Ours
does the same: every sample is max_seq_len zeros (token 0 exists in every vocabulary), so
the data of an index is the same on every client and in every process, and there are
2^64 - 1 sequences, as many as Psyche's. (Psyche's dummy samples are max_seq_len + 1
tokens long; ours have the max_seq_len tokens of every other provider here.)
"""

from __future__ import annotations

import torch

from psyche_common.token_files.sequences import DataProviderError, check_batch

DUMMY_NUM_SEQUENCES = 2**64 - 1
DUMMY_TOKEN = 0
# A batch id covers at most one step's batch, and global_batch_size is a u16: a larger
# request is a bug, refused rather than allocated.
MAX_BATCH = 2**16 - 1


class DummyDataProvider:
    """Samples of `max_seq_len` zeros for any index below `num_sequences`."""

    def __init__(self, max_seq_len: int, num_sequences: int = DUMMY_NUM_SEQUENCES) -> None:
        if max_seq_len < 1:
            raise DataProviderError(f"max_seq_len must be >= 1, got {max_seq_len}")
        if num_sequences < 1:
            raise DataProviderError(f"num_sequences must be >= 1, got {num_sequences}")
        self.max_seq_len = max_seq_len
        self._num_sequences = num_sequences

    @property
    def num_sequences(self) -> int:
        return self._num_sequences

    def get_samples(self, start: int, end: int) -> torch.Tensor:
        """Samples start..end (inclusive) as an int64 tensor [end - start + 1, max_seq_len]."""
        check_batch(start, end, self._num_sequences)
        if end - start + 1 > MAX_BATCH:
            raise DataProviderError(
                f"batch id [{start}, {end}] asks for {end - start + 1} sequences, more than "
                f"a step's batch can hold ({MAX_BATCH})"
            )
        return torch.full((end - start + 1, self.max_seq_len), DUMMY_TOKEN, dtype=torch.int64)

    async def fetch(self, start: int, end: int) -> torch.Tensor:
        return self.get_samples(start, end)
