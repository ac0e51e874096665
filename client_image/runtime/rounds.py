"""What a client tracks per training step, and the pure rules it applies to it.

For each step s the client keeps who trains which batch (the coordinator's assignment,
recomputed locally), the result announcements heard for it, the payloads downloaded and
verified, the `Finished` broadcasts heard, and the two witness bloom filters:

    participant_bloom  <- SHA-256(signer) of every trainer whose payload verified
    broadcast_bloom    <- commitment of the first verified payload of each batch

Consensus for applying step s at round h+2 (docs/coordinator.md, "Consensus for apply"):
for each batch of step s, a commitment's score is the number of round-h+1 witnesses
whose broadcast bloom contains it; the best score wins if it reaches
quorum(len(witnesses)), else the batch is skipped. Every honest client computes the same
winners from the same coordinator state, so every client applies the same update.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from coordinator import (
    Bloom,
    ClientState,
    Committee,
    CommitteeProof,
    Coordinator,
    CoordinatorState,
    NodeIdentity,
    Round,
    Witness,
    WitnessProof,
    assign_data_for_state,
    data_hash,
    merkle_root,
    participant_item,
    selection_for_round,
    witness_quorum,
)
from coordinator.limits import BLOOM_KEYS

BatchKey = tuple[int, int]


def random_bloom() -> Bloom:
    """Witness blooms use random keys: the coordinator only reads them (docs/coordinator.md,
    "Bloom filters")."""
    return Bloom(keys=tuple(int.from_bytes(os.urandom(8), "little") for _ in range(BLOOM_KEYS)))


def commitment_of(step: int, batch: BatchKey, payload: bytes) -> bytes:
    """The hash a trainer commits to for its result: `data_hash` over our wire bytes
    (docs/coordinator.md, "Commitments and Merkle roots")."""
    return data_hash(step, batch[0], batch[1], [(payload, b"")])


@dataclass
class Announced:
    sender: bytes
    blob_hash: bytes
    blob_size: int


@dataclass
class StepRecord:
    step: int
    height: int
    assignments: dict[BatchKey, NodeIdentity]
    announced: dict[BatchKey, dict[bytes, Announced]] = field(default_factory=dict)
    payloads: dict[bytes, bytes] = field(default_factory=dict)  # commitment -> verified bytes
    participant_bloom: Bloom = field(default_factory=random_bloom)
    broadcast_bloom: Bloom = field(default_factory=random_bloom)
    accepted_order: list[bytes] = field(default_factory=list)  # commitments, arrival order
    finished_from: set[bytes] = field(default_factory=set)
    witness_sent: bool = False
    finished_sent: bool = False
    trained: bool = False

    @classmethod
    def for_state(cls, state: CoordinatorState) -> StepRecord:
        return cls(step=state.progress.step, height=state.current_round.height,
                   assignments={(batch.start, batch.end): node
                                for batch, node in assign_data_for_state(state).items()})

    def batch_of(self, trainer: bytes) -> BatchKey | None:
        for batch, node in self.assignments.items():
            if node.key == trainer:
                return batch
        return None

    def expects(self, batch: BatchKey, sender: bytes) -> bool:
        node = self.assignments.get(batch)
        return node is not None and node.key == sender

    def announce(self, batch: BatchKey, commitment: bytes, sender: bytes, blob_hash: bytes,
                 blob_size: int) -> bool:
        """Note an announcement; False if it was already known."""
        known = self.announced.setdefault(batch, {})
        if commitment in known:
            return False
        known[commitment] = Announced(sender, blob_hash, blob_size)
        return True

    def record_verified(self, batch: BatchKey, commitment: bytes, payload: bytes) -> None:
        """A payload for `batch` from its assignee verified against its commitment."""
        if commitment in self.payloads or commitment not in self.announced.get(batch, {}):
            return
        first_for_batch = not any(c in self.payloads for c in self.announced[batch])
        self.payloads[commitment] = payload
        self.participant_bloom.add(participant_item(self.announced[batch][commitment].sender))
        if first_for_batch:
            self.broadcast_bloom.add(commitment)
            self.accepted_order.append(commitment)

    def all_downloaded(self) -> bool:
        return all(any(c in self.payloads for c in self.announced.get(batch, {}))
                   for batch in self.assignments)

    def merkle(self) -> bytes:
        return merkle_root(self.accepted_order)


def make_witness(record: StepRecord | None, index: int, position: int, is_witness: bool) -> Witness:
    """The witness message for the previous step's results (empty blooms if none)."""
    if record is None:
        return Witness(proof=WitnessProof(position, index, is_witness))
    return Witness(proof=WitnessProof(position, index, is_witness),
                   participant_bloom=record.participant_bloom,
                   broadcast_bloom=record.broadcast_bloom,
                   broadcast_merkle=record.merkle())


def consensus_winners(record: StepRecord, vouching_round: Round) -> dict[BatchKey, bytes]:
    """Batch -> winning commitment of `record`'s step, judged by `vouching_round`'s witnesses."""
    witnesses = vouching_round.witnesses
    quorum = witness_quorum(len(witnesses))
    winners: dict[BatchKey, bytes] = {}
    if quorum == 0:
        return winners
    for batch in sorted(record.announced):
        best, best_score = None, 0
        for commitment in sorted(record.announced[batch]):
            score = sum(1 for w in witnesses if w.broadcast_bloom.contains(commitment))
            if score > best_score:
                best, best_score = commitment, score
        if best is not None and best_score >= quorum:
            winners[batch] = best
    return winners


def trains_this_round(step: int, last_step: int) -> bool:
    """Whether a round's assigned batches are trained: every round but an epoch's last two
    (`last_step` set), which only apply what was already trained (docs/distro.md)."""
    return last_step == 0 or step < last_step - 2


def my_witness_proof(state: CoordinatorState, me: NodeIdentity) -> tuple[int, int, bool] | None:
    """(index, position, elected) for the current round, None if not a client."""
    index = state.index_of(me)
    if index is None:
        return None
    proof = selection_for_round(state).witness_of(index)
    return index, proof.position, proof.witness


def unhealthy_trainers(state: CoordinatorState,
                       expected_senders: set[bytes]) -> list[tuple[NodeIdentity, CommitteeProof]]:
    """Health checks at round start (docs/coordinator.md, "Health checks"): previous-round
    trainers the previous witnesses did not confirm.

    Only trainers that actually had a batch to send are judged (a trainer with an empty
    share never appears in a participant bloom)."""
    previous = state.previous_round
    if previous is None or state.current_round.height < 2:
        return []
    selection = selection_for_round(state, previous)
    judge = Coordinator(state)  # read-only use of the coordinator's own health rule
    listed = {c.id: c for c in state.epoch_state.clients}
    checks = []
    for index in range(previous.clients_len):
        client = state.client_at(index, previous.clients_len)
        if client is None or client.id.key not in expected_senders:
            continue
        proof = selection.committee_of(index)
        if proof.committee is not Committee.Trainer:
            continue
        current = listed.get(client.id)
        if current is None or current.state is not ClientState.Healthy:
            continue
        if not judge.is_healthy(client.id, proof):
            checks.append((client.id, proof))
    return checks
