"""The ChaCha8Rng + rand 0.8 shuffle port."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psyche_common.token_files.chacha import ChaChaRng, chacha_blocks, shuffle_in_place


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


def test_gen_index_is_in_range_and_roughly_uniform():
    rng = ChaChaRng(bytes(32))
    counts = Counter(rng.gen_index(3) for _ in range(3000))
    assert set(counts) == {0, 1, 2}
    assert min(counts.values()) > 900
    with pytest.raises(ValueError, match="bound"):
        rng.gen_index(0)


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
