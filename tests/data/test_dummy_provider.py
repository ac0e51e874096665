"""DummyDataProvider: Psyche's Dummy data location (all-zero tokens for every index)."""

import pytest
import torch

from client_image.data import DataProviderError, DummyDataProvider, open_provider
from client_image.data.dummy import DUMMY_NUM_SEQUENCES, MAX_BATCH
from coordinator.config import DummyDataLocation


async def test_samples_are_zeros_of_the_run_length() -> None:
    provider = DummyDataProvider(8)
    batch = await provider.fetch(0, 2)
    assert batch.shape == (3, 8) and batch.dtype == torch.int64
    assert batch.eq(0).all()


async def test_same_index_same_data_anywhere_in_the_index() -> None:
    first, second = DummyDataProvider(5), DummyDataProvider(5)
    late = DUMMY_NUM_SEQUENCES - 3
    assert torch.equal(await first.fetch(late, late + 2), await second.fetch(late, late + 2))
    assert torch.equal(await first.fetch(7, 7), await first.fetch(10**12, 10**12))


async def test_open_provider_gives_psyches_length() -> None:
    provider = await open_provider(DummyDataLocation(), 4)
    assert isinstance(provider, DummyDataProvider)
    assert provider.num_sequences == 2**64 - 1


@pytest.mark.parametrize(("start", "end", "message"), [
    (-1, 0, r"bad batch id \[-1, 0\]"),
    (3, 2, r"bad batch id \[3, 2\]"),
    (DUMMY_NUM_SEQUENCES, DUMMY_NUM_SEQUENCES, "out of range"),
    (0, MAX_BATCH, "more than a step's batch can hold"),
])
def test_bad_batch_ids_are_one_line_errors(start: int, end: int, message: str) -> None:
    with pytest.raises(DataProviderError, match=message) as info:
        DummyDataProvider(4).get_samples(start, end)
    assert "\n" not in str(info.value)


def test_bad_lengths_are_refused() -> None:
    with pytest.raises(DataProviderError, match="max_seq_len must be >= 1"):
        DummyDataProvider(0)
    with pytest.raises(DataProviderError, match="num_sequences must be >= 1"):
        DummyDataProvider(4, num_sequences=0)
