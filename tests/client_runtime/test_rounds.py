"""The client's per-step bookkeeping and consensus rules (client_image/runtime/rounds.py)."""

from __future__ import annotations

from client_image.runtime.rounds import (
    StepRecord,
    commitment_of,
    consensus_winners,
    make_witness,
    random_bloom,
)
from coordinator import NodeIdentity, Round, Witness, WitnessProof, participant_item

A, B, C = (NodeIdentity(bytes([i]) * 32) for i in (1, 2, 3))


def record() -> StepRecord:
    return StepRecord(step=5, height=2, assignments={(0, 3): A, (4, 7): B, (8, 11): C})


def vouching(*blooms_contents: list[bytes]) -> Round:
    witnesses = []
    for index, items in enumerate(blooms_contents):
        bloom = random_bloom()
        for item in items:
            bloom.add(item)
        witnesses.append(Witness(WitnessProof(index, index, True), broadcast_bloom=bloom))
    return Round(witnesses=witnesses)


def test_commitment_binds_step_batch_and_bytes() -> None:
    base = commitment_of(5, (0, 3), b"payload")
    assert base != commitment_of(6, (0, 3), b"payload")
    assert base != commitment_of(5, (0, 4), b"payload")
    assert base != commitment_of(5, (0, 3), b"payloaD")
    assert len(base) == 32


def test_only_the_assignee_is_expected_and_first_payload_per_batch_enters_the_bloom() -> None:
    rec = record()
    assert rec.expects((0, 3), A.key) and not rec.expects((0, 3), B.key)
    assert not rec.expects((1, 2), A.key)
    first, second = commitment_of(5, (0, 3), b"x"), commitment_of(5, (0, 3), b"y")
    assert rec.announce((0, 3), first, A.key, b"h" * 32, 1)
    assert not rec.announce((0, 3), first, A.key, b"h" * 32, 1)  # a repeat is not news
    assert rec.announce((0, 3), second, A.key, b"g" * 32, 1)
    rec.record_verified((0, 3), first, b"x")
    rec.record_verified((0, 3), second, b"y")
    assert rec.broadcast_bloom.contains(first)
    assert rec.accepted_order == [first]
    assert rec.participant_bloom.contains(participant_item(A.key))
    assert not rec.participant_bloom.contains(participant_item(B.key))
    rec.record_verified((4, 7), commitment_of(5, (4, 7), b"z"), b"z")  # never announced
    assert not rec.all_downloaded()


def test_consensus_needs_a_quorum_of_witness_blooms() -> None:
    rec = record()
    good = {batch: commitment_of(5, batch, bytes(batch)) for batch in rec.assignments}
    for batch, commitment in good.items():
        rec.announce(batch, commitment, rec.assignments[batch].key, b"h" * 32, 4)
    forged = commitment_of(5, (8, 11), b"forged")
    rec.announce((8, 11), forged, C.key, b"f" * 32, 4)
    # 3 witnesses -> quorum 2. Batch (0,3): 3 votes; (4,7): 1 vote; (8,11): forged 2 votes.
    witnesses = vouching([good[(0, 3)], good[(4, 7)], forged], [good[(0, 3)], forged],
                         [good[(0, 3)], good[(8, 11)]])
    winners = consensus_winners(rec, witnesses)
    assert winners[(0, 3)] == good[(0, 3)]
    assert (4, 7) not in winners  # below quorum: skipped by everyone alike
    assert winners[(8, 11)] == forged  # the commitment the quorum saw wins
    assert consensus_winners(rec, Round()) == {}


def test_witness_carries_the_previous_steps_blooms_and_merkle_root() -> None:
    rec = record()
    commitment = commitment_of(5, (0, 3), b"x")
    rec.announce((0, 3), commitment, A.key, b"h" * 32, 1)
    rec.record_verified((0, 3), commitment, b"x")
    witness = make_witness(rec, index=2, position=0, is_witness=True)
    assert witness.proof == WitnessProof(0, 2, True)
    assert witness.broadcast_bloom.contains(commitment)
    assert witness.broadcast_merkle == rec.merkle() != bytes(32)
    empty = make_witness(None, index=1, position=1, is_witness=False)
    assert empty.broadcast_merkle == bytes(32) and not empty.proof.witness
