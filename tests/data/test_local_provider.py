"""LocalDataProvider: the reference's sample ranges, shuffling and clear errors."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from client_image.data import DataProviderError, LocalDataProvider, shuffle_in_place
from coordinator.config import SeededShuffle, TokenSize


def _write(path, tokens, dtype="<u2"):
    np.asarray(tokens, dtype=dtype).tofile(path)
    return path


def test_sample_i_is_exactly_its_token_range(tmp_path):
    _write(tmp_path / "a.ds", range(13))
    provider = LocalDataProvider(tmp_path, max_seq_len=4)
    # offsets 0, 8, 16 bytes (< 26 - 8): tokens 0-3, 4-7, 8-11; token 12 is left over.
    assert provider.num_sequences == 3
    assert provider.get_samples(0, 2).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert provider.get_samples(1, 1).dtype == torch.int64


def test_an_exact_multiple_file_loses_its_last_sample_like_psyche(tmp_path):
    _write(tmp_path / "a.ds", range(12))
    assert LocalDataProvider(tmp_path, max_seq_len=4).num_sequences == 2


def test_files_are_concatenated_in_name_order_and_other_files_ignored(tmp_path):
    _write(tmp_path / "b.bin", range(100, 109))
    _write(tmp_path / "a.npy", range(9))
    (tmp_path / "notes.txt").write_text("not tokens")
    provider = LocalDataProvider(tmp_path, max_seq_len=4)
    assert provider.get_samples(0, 3).tolist() == [
        [0, 1, 2, 3], [4, 5, 6, 7], [100, 101, 102, 103], [104, 105, 106, 107],
    ]


def test_four_byte_tokens(tmp_path):
    _write(tmp_path / "a.ds", [70_000 + i for i in range(9)], dtype="<u4")
    provider = LocalDataProvider(tmp_path, max_seq_len=4, token_size=TokenSize.FourBytes)
    assert provider.get_samples(1, 1).tolist() == [[70_004, 70_005, 70_006, 70_007]]


def test_seeded_shuffle_permutes_samples_with_chacha8(tmp_path):
    _write(tmp_path / "a.ds", range(41))
    seed = bytes(range(32))
    plain = LocalDataProvider(tmp_path, max_seq_len=4)
    shuffled = LocalDataProvider(tmp_path, max_seq_len=4, shuffle=SeededShuffle(seed=seed))
    order = list(range(plain.num_sequences))
    shuffle_in_place(order, seed)
    expected = plain.get_samples(0, plain.num_sequences - 1)[order]
    assert torch.equal(shuffled.get_samples(0, shuffled.num_sequences - 1), expected)
    assert order != sorted(order)


def test_seeded_shuffle_gives_the_samples_psyche_gives(tmp_path):
    # Data index k must be the sequence Psyche's LocalDataProvider puts at k: the Rust
    # shuffle of [0, ..., 9] with this seed (tests/data/rand_shuffle_vectors.json).
    vectors = json.loads((Path(__file__).parent / "rand_shuffle_vectors.json").read_text())
    case = next(c for c in vectors["shuffles"] if c["seed"] == "one_to_32" and c["length"] == 10)
    _write(tmp_path / "a.ds", range(41))  # 10 sequences of 4 tokens: sequence j starts at 4j
    seed = bytes(vectors["seeds"]["one_to_32"])
    provider = LocalDataProvider(tmp_path, max_seq_len=4, shuffle=SeededShuffle(seed=seed))
    firsts = provider.get_samples(0, 9)[:, 0].tolist()
    assert firsts == [4 * j for j in case["permutation"]]


def test_bundled_data_set_has_train_and_validation_splits():
    assets = Path(__file__).resolve().parents[2] / "assets" / "data"
    train = LocalDataProvider(assets / "train", max_seq_len=128)
    validation = LocalDataProvider(assets / "validation", max_seq_len=128)
    assert train.num_sequences > 8000 and validation.num_sequences > 400
    assert int(train.get_samples(0, train.num_sequences - 1).max()) < 4096


@pytest.mark.parametrize(("setup", "message"), [
    (lambda d: None, "has no token files"),
    (lambda d: _write(d / "a.ds", range(4)), "short file"),
    (lambda d: (d / "a.ds").write_bytes(b"\x01\x02\x03"), "whole number"),
])
def test_bad_directories_are_rejected(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(DataProviderError, match=message):
        LocalDataProvider(tmp_path, max_seq_len=4)


def test_missing_directory_and_bad_indices(tmp_path):
    with pytest.raises(DataProviderError, match="does not exist"):
        LocalDataProvider(tmp_path / "nope", max_seq_len=4)
    _write(tmp_path / "a.ds", range(13))
    provider = LocalDataProvider(tmp_path, max_seq_len=4)
    with pytest.raises(DataProviderError, match="out of range: the data set has 3 sequences"):
        provider.get_samples(2, 3)
    with pytest.raises(DataProviderError, match="bad batch id"):
        provider.get_samples(2, 1)


async def test_fetch_runs_off_the_event_loop(tmp_path):
    _write(tmp_path / "a.ds", range(13))
    provider = LocalDataProvider(tmp_path, max_seq_len=4)
    assert (await provider.fetch(1, 2)).tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
