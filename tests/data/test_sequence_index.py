"""The sequence index as arrays: the vectorised Seeded shuffle against the reference port
and Rust's vectors, and the array index against the one-object-per-sequence rules."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator.config import DontShuffle, SeededShuffle, TokenSize
from psyche_common.token_files import LocalDataProvider
from psyche_common.token_files.chacha import shuffle_in_place
from psyche_common.token_files.permutation import (
    KeyStream,
    draw_swap_targets,
    shuffle_permutation,
)
from psyche_common.token_files.sequences import adjacent_runs, build_sequence_index

VECTORS = json.loads((Path(__file__).parent / "rand_shuffle_vectors.json").read_text())
SEEDS = {name: bytes(seed) for name, seed in VECTORS["seeds"].items()}


@pytest.mark.parametrize("case", [c for c in VECTORS["shuffles"] if "permutation" in c],
                         ids=lambda c: f"{c['seed']}-{c['length']}")
def test_permutation_matches_rust_rand_0_9_and_draws_as_many_words(case):
    stream = KeyStream(SEEDS[case["seed"]])
    _, used = draw_swap_targets(case["length"], stream)
    assert int(stream.words(used, 1)[0]) == case["next_u32_after"]
    assert shuffle_permutation(case["length"], SEEDS[case["seed"]]).tolist() == case["permutation"]


@pytest.mark.parametrize("case", [c for c in VECTORS["shuffles"] if "permutation" not in c],
                         ids=lambda c: f"{c['seed']}-{c['length']}")
def test_long_permutations_match_rust_heads_tails_and_word_counts(case):
    stream = KeyStream(SEEDS[case["seed"]])
    _, used = draw_swap_targets(case["length"], stream)
    assert int(stream.words(used, 1)[0]) == case["next_u32_after"]
    order = shuffle_permutation(case["length"], SEEDS[case["seed"]])
    assert order[:16].tolist() == case["head"] and order[-16:].tolist() == case["tail"]


# Lengths around where rand's chunks change digit counts (1626: 3 -> 2 digits; 65536: 2 -> 1)
@pytest.mark.parametrize("length", [0, 1, 2, 13, 1626, 1627, 65535, 65536, 65537, 65538, 150_000])
def test_permutation_is_the_reference_shuffle_of_0_to_n(length):
    seed = os.urandom(32)
    reference = list(range(length))
    shuffle_in_place(reference, seed)
    assert shuffle_permutation(length, seed).tolist() == reference, seed.hex()


def _object_index(sizes, sample_bytes, reserve, shuffle):
    """The rules as the one-object-per-sequence code applied them."""
    refs = [(f, offset) for f, size in enumerate(sizes)
            for offset in range(0, max(size - sample_bytes - reserve, 0), sample_bytes)]
    if isinstance(shuffle, SeededShuffle):
        shuffle_in_place(refs, shuffle.seed)
    return refs


@pytest.mark.parametrize("shuffle", [DontShuffle(), SeededShuffle(seed=bytes(range(32)))])
@pytest.mark.parametrize("reserve", [0, 2])
def test_array_index_equals_the_object_index(shuffle, reserve):
    sizes = [64 * 7, 64 * 7 + 2, 64 + 2, 64 * 3 + 4, 64 * 1000 + 6]
    index = build_sequence_index(sizes, 64, reserve, shuffle)
    assert index.file_index.dtype == index.byte_offset.dtype == np.int64
    assert list(zip(index.file_index.tolist(), index.byte_offset.tolist(), strict=True)) == \
        _object_index(sizes, 64, reserve, shuffle)
    assert index.nbytes == 16 * len(index)


def test_adjacent_runs_split_on_a_file_change_or_a_gap():
    files = np.array([0, 0, 0, 1, 1, 0])
    offsets = np.array([0, 8, 24, 32, 40, 48])
    assert adjacent_runs(files, offsets, 8) == [(0, 0, 2), (0, 24, 1), (1, 32, 2), (0, 48, 1)]
    assert adjacent_runs(files[:0], offsets[:0], 8) == []


@pytest.mark.parametrize("token_size", [TokenSize.TwoBytes, TokenSize.FourBytes])
def test_memory_mapped_rows_give_the_bytes_of_each_samples_range(tmp_path, token_size):
    # Files with a partial tail: rows stop before it; the bytes are the file's, shuffled.
    rng = np.random.default_rng(7)
    dtype = "<u2" if token_size is TokenSize.TwoBytes else "<u4"
    raw = []
    for name, tokens in [("a.ds", 8 * 9 + 3), ("b.bin", 8 * 4), ("c.npy", 8 * 6 + 1)]:
        data = rng.integers(0, 60_000, tokens).astype(dtype).tobytes()
        (tmp_path / name).write_bytes(data)
        raw.append(data)
    seed = bytes([9] * 32)
    provider = LocalDataProvider(tmp_path, 8, token_size, SeededShuffle(seed=seed))
    sample = 8 * token_size.nbytes
    expected = [data[offset : offset + sample] for file, offset in
                _object_index([len(d) for d in raw], sample, 0, SeededShuffle(seed=seed))
                for data in [raw[file]]]
    samples = provider.get_samples(0, provider.num_sequences - 1)
    assert samples.dtype == torch.int64 and provider.num_sequences == 9 + 3 + 6
    assert [row.numpy().astype(dtype).tobytes() for row in samples] == expected
