"""The exact numbers of the reference: quorum, shuffles, hashes, bloom, merkle, batch ramp."""

from __future__ import annotations

import hashlib

from coordinator_sim import state_file

from coordinator import (
    Bloom,
    CommitteeSelection,
    Lcg,
    data_hash,
    fnv1a64,
    lcg_shuffle,
    merkle_root,
    split_batches,
    swap_or_not,
    witness_quorum,
)
from coordinator.committee import election_table
from coordinator.data_assignment import data_index_for_step


def sha(*parts: bytes) -> bytes:
    return hashlib.sha256(b"".join(parts)).digest()


def spec_swap_or_not(i: int, n: int, key: bytes) -> int:
    """The reference's pseudo-code, transcribed literally for one index."""
    for r in range(90):
        pivot = int.from_bytes(sha(key, bytes([r]))[:8], "little") % n
        flip = (pivot + n - i) % n
        p = max(i, flip)
        h = sha(key, bytes([r]), (p // 256).to_bytes(4, "little"))
        if (h[(p % 256) // 8] >> (p % 8)) & 1:
            i = flip
    return i


def test_quorum() -> None:
    assert [witness_quorum(n) for n in (1, 2, 3, 4, 5, 6, 9, 32)] == [1, 2, 2, 2, 3, 4, 6, 21]


def test_swap_or_not_matches_spec_and_pinned_values() -> None:
    key = sha(b"key")
    assert [swap_or_not(i, 10, key) for i in range(10)] == [2, 1, 7, 6, 8, 5, 0, 4, 3, 9]
    for n in (1, 2, 7, 256, 300):
        table = [swap_or_not(i, n, key) for i in range(n)]
        assert sorted(table) == list(range(n))
        assert all(spec_swap_or_not(i, n, key) == table[i] for i in range(0, n, 37))


def test_election_uses_sha_of_seed_then_salt() -> None:
    seed = 7
    s = sha(seed.to_bytes(8, "little"))
    assert election_table(seed, 10, b"witness") == tuple(
        spec_swap_or_not(i, 10, sha(s, b"witness")) for i in range(10))
    assert election_table(seed, 10, b"witness") == (9, 1, 4, 8, 6, 0, 2, 5, 7, 3)
    selection = CommitteeSelection(n=10, seed=seed, witness_nodes=3)
    assert selection.witness_indices() == [1, 5, 6]  # positions 1, 0, 2 are < 3
    assert selection.witness_of(5).witness and not selection.witness_of(0).witness
    everyone = CommitteeSelection(n=40, seed=seed, witness_nodes=0)
    assert len(everyone.witness_indices()) == 32


def test_lcg_and_fisher_yates() -> None:
    rng = Lcg(0)
    assert [rng.next() for _ in range(3)] == [
        1442695040888963407, 1876011003808476466, 11166244414315200793]
    # by hand with seed 0: i=2: j = 1442695040888963407 % 3 = 1 -> [0,2,1];
    # i=1: j = 1876011003808476466 % 2 = 0 -> [2,0,1]
    assert lcg_shuffle([0, 1, 2], 0) == [2, 0, 1]
    assert lcg_shuffle(list(range(8)), 42) == [0, 3, 6, 7, 4, 5, 2, 1]


def test_split_batches_contiguous_with_extra_for_first_shuffled() -> None:
    shares = split_batches(100, 7, [0, 1, 2], 0)  # shuffled order [2, 0, 1]; 7 = 3+2+2
    assert shares[2].start == 100 and shares[2].end == 102
    assert (shares[0].start, shares[0].end) == (103, 104)
    assert (shares[1].start, shares[1].end) == (105, 106)
    few = split_batches(0, 2, [0, 1, 2, 3], 0)
    assert len(few) == 2 and sum(b.size for b in few.values()) == 2


def test_batch_size_ramp_and_data_index_replay() -> None:
    cfg = state_file(global_batch_size_start=2, global_batch_size_end=6,
                     global_batch_size_warmup_tokens=4 * 512).config
    # tokens = index * 512; size(0)=2, size(2*512)=round(2+4*0.5)=4, then >= warmup -> 6
    assert [cfg.batch_size(i * 512) for i in (0, 2, 3, 4, 6)] == [2, 4, 5, 6, 6]
    assert [data_index_for_step(cfg, 512, s) for s in (1, 2, 3, 4)] == [0, 2, 6, 12]


def test_fnv_and_bloom() -> None:
    assert fnv1a64(0xCBF29CE484222325, b"a") == 0xAF63DC4C8601EC8C  # the standard FNV-1a value
    bloom = Bloom(keys=tuple(range(8)))
    bloom.add(b"alice")
    assert bloom.contains(b"alice") and bin(bloom.bits).count("1") <= 8
    position = fnv1a64(3, b"alice") % 1024
    assert (bloom.words[position // 64] >> (position % 64)) & 1
    assert Bloom.from_words(bloom.words, bloom.keys) == bloom


def test_merkle_and_commitment() -> None:
    assert merkle_root([]) == bytes(32)
    leaf = sha(b"\x00", b"a")
    assert merkle_root([b"a"]) == leaf
    a, b, c = (sha(b"\x00", x) for x in (b"a", b"b", b"c"))
    ab, cc = sha(b"\x01", a, b), sha(b"\x01", c, c)
    assert merkle_root([b"a", b"b", b"c"]) == sha(b"\x01", ab, cc)
    expected = sha((5).to_bytes(4, "big"), (10).to_bytes(8, "big"), (12).to_bytes(8, "big"),
                   b"ij", b"vv")
    assert data_hash(5, 10, 12, [(b"ij", b"vv")]) == expected
