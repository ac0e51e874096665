"""The ChaCha8Rng + rand 0.9 shuffle port."""

import hashlib
import json
import struct
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psyche_common.token_files.chacha import (
    ChaChaRng,
    chacha_blocks,
    shuffle_in_place,
    shuffle_with_rng,
)

# Results of the real Rust rand 0.9.2 / rand_chacha 0.9.0 code; see its "_note".
VECTORS = json.loads((Path(__file__).parent / "rand_shuffle_vectors.json").read_text())
SEEDS = {name: bytes(seed) for name, seed in VECTORS["seeds"].items()}


def test_chacha20_matches_rand_chacha_true_values():
    # rand_chacha's test_chacha_true_values_a (IETF draft vectors 1 and 2): the round function
    # and the block layout ChaCha8 shares with ChaCha20.
    words = chacha_blocks(bytes(32), 0, 2, rounds=20).tolist()
    assert words[:4] == [0xADE0B876, 0x903DF1A0, 0xE56A5D40, 0x28BD8653]
    assert words[15] == 0x8665EEB2
    assert words[16:18] == [0xBEE7079F, 0x7A385155]


def test_chacha20_block_counter_matches_rand_chacha_multiple_blocks():
    seed = bytes(b for i in range(8) for b in (i, 0, 0, 0))
    rng = ChaChaRng(seed, rounds=20)
    diagonal = []
    for _ in range(16):
        diagonal.append(rng.next_u32())
        for _ in range(16):
            rng.next_u32()
    assert diagonal[:3] == [0xF225C81A, 0x6AB1BE57, 0x04D42951]
    assert diagonal[-1] == 0xC1F8E7F4


def test_chacha_crosses_its_buffer_without_a_seam():
    rng = ChaChaRng(bytes(range(32)))
    words = [rng.next_u32() for _ in range(16 * 300)]
    assert words == chacha_blocks(bytes(range(32)), 0, 300).tolist()


def test_random_below_is_in_range_and_roughly_uniform():
    rng = ChaChaRng(bytes(32))
    counts = Counter(rng.random_below(3) for _ in range(3000))
    assert set(counts) == {0, 1, 2}
    assert min(counts.values()) > 900
    with pytest.raises(ValueError, match="bound"):
        rng.random_below(0)


def test_random_below_draws_a_second_word_only_in_the_top_zone():
    # Canon's method: the first product's low half decides whether a second word is drawn;
    # a bound of 2^32 - 1 puts almost every word in that zone, a bound of 1 none.
    seed = SEEDS["mixed"]
    words = ChaChaRng(seed)
    rng = ChaChaRng(seed)
    rng.random_below(1)
    assert rng.next_u32() == [words.next_u32() for _ in range(2)][1]
    rng, words = ChaChaRng(seed), ChaChaRng(seed)
    rng.random_below(2**32 - 1)
    assert rng.next_u32() == [words.next_u32() for _ in range(3)][2]


@pytest.mark.parametrize("name", sorted(VECTORS["streams"]))
def test_chacha8_stream_matches_rust(name):
    rng = ChaChaRng(SEEDS[name])
    assert [rng.next_u32() for _ in range(8)] == VECTORS["streams"][name]


def _case_id(case):
    return f"{case['seed']}-{case['length']}"


@pytest.mark.parametrize("case", VECTORS["shuffles"], ids=_case_id)
def test_shuffle_matches_rust_rand_0_9(case):
    rng = ChaChaRng(SEEDS[case["seed"]])
    items = list(range(case["length"]))
    shuffle_with_rng(items, rng)
    # The next word pins how many words the shuffle drew, not just the order it made.
    assert rng.next_u32() == case["next_u32_after"]
    if "permutation" in case:
        assert items == case["permutation"]
    else:
        assert items[:16] == case["head"] and items[-16:] == case["tail"]
        assert {str(i): items[i] for i in map(int, case["at"])} == case["at"]
        digest = hashlib.sha256(struct.pack(f"<{len(items)}I", *items)).hexdigest()
        assert digest == case["sha256_u32le"]


def test_vectors_cover_the_issue_lengths():
    lengths = {case["length"] for case in VECTORS["shuffles"]}
    assert {2, 3, 10, 1000, 65_537} <= lengths


def test_shuffle_in_place_is_shuffle_with_a_fresh_chacha8():
    case = next(c for c in VECTORS["shuffles"] if c["seed"] == "one_to_32" and c["length"] == 100)
    items = list(range(100))
    shuffle_in_place(items, SEEDS["one_to_32"])
    assert items == case["permutation"]


@given(st.lists(st.integers(), max_size=300), st.binary(min_size=32, max_size=32))
def test_shuffle_is_a_deterministic_permutation(items, seed):
    a, b = list(items), list(items)
    shuffle_in_place(a, seed)
    shuffle_in_place(b, seed)
    assert a == b
    assert sorted(a) == sorted(items)


def test_different_seeds_give_different_orders():
    a, b = list(range(100)), list(range(100))
    shuffle_in_place(a, bytes(32))
    shuffle_in_place(b, bytes([1] * 32))
    assert a != b and a != list(range(100))


def test_seed_must_be_32_bytes():
    with pytest.raises(ValueError, match="32 bytes"):
        ChaChaRng(b"short")
