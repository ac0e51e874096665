"""Committee and witness election for one round (docs/coordinator.md,
"Committees and witness election").

    S = SHA-256(seed_u64_le);  pos(i, salt) = swap_or_not(i, n, SHA-256(S || salt))
    committee: pos < tie_breakers -> TieBreaker; < tie_breakers + verifiers -> Verifier; else Trainer
    witness:   pos < witness_nodes (pos < min(n, 32) when witness_nodes = 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache
from typing import TypeVar

from coordinator.limits import MAX_WITNESSES
from coordinator.shuffle import sha256, swap_or_not_table

T = TypeVar("T")

COMMITTEE_SALT = b"committee"
WITNESS_SALT = b"witness"


class Committee(IntEnum):
    TieBreaker = 0
    Verifier = 1
    Trainer = 2


@dataclass(frozen=True, slots=True)
class CommitteeProof:
    committee: Committee
    position: int
    index: int


@dataclass(frozen=True, slots=True)
class WitnessProof:
    """position/index in the round's witness election; witness=False for warm-up witnesses."""

    position: int
    index: int
    witness: bool


class SelectionError(ValueError):
    pass


@lru_cache(maxsize=512)
def election_table(seed: int, n: int, salt: bytes) -> tuple[int, ...]:
    key = sha256(sha256(seed.to_bytes(8, "little")), salt)
    return swap_or_not_table(key, n)


def election_order(members: Sequence[T], seed: int, salt: bytes) -> list[T]:
    """`members` (in a fixed order, e.g. sorted by key) sorted by their election position."""
    table = election_table(seed, len(members), salt)
    return [member for _, member in sorted(zip(table, members, strict=True))]


def witness_quorum(witnesses: int) -> int:
    """Agreeing witnesses needed out of `witnesses`: 1->1, 2->2, 3->2, n>=4 -> floor(2n/3)."""
    if witnesses <= 2:
        return witnesses
    if witnesses == 3:
        return 2
    return (2 * witnesses) // 3


@dataclass(frozen=True)
class CommitteeSelection:
    """The elections of one round: n = round.clients_len, seed = round.random_seed."""

    n: int
    seed: int
    witness_nodes: int = 0
    tie_breakers: int = 0
    verification_percent: int = 0

    def __post_init__(self) -> None:
        if self.n < self.tie_breakers:
            raise SelectionError(f"{self.n} clients < {self.tie_breakers} tie breakers")
        if self.witness_nodes != 0 and self.n < self.witness_nodes:
            raise SelectionError(f"{self.n} clients < {self.witness_nodes} witness nodes")
        if self.verification_percent > 100:
            raise SelectionError(f"verification_percent {self.verification_percent} > 100")

    @property
    def verifiers(self) -> int:
        return (self.n - self.tie_breakers) * self.verification_percent // 100

    @property
    def witness_count(self) -> int:
        return self.witness_nodes if self.witness_nodes else min(self.n, MAX_WITNESSES)

    def committee_of(self, index: int) -> CommitteeProof:
        position = election_table(self.seed, self.n, COMMITTEE_SALT)[index]
        if position < self.tie_breakers:
            committee = Committee.TieBreaker
        elif position < self.tie_breakers + self.verifiers:
            committee = Committee.Verifier
        else:
            committee = Committee.Trainer
        return CommitteeProof(committee, position, index)

    def witness_of(self, index: int) -> WitnessProof:
        position = election_table(self.seed, self.n, WITNESS_SALT)[index]
        return WitnessProof(position, index, position < self.witness_count)

    def witness_indices(self) -> list[int]:
        table = election_table(self.seed, self.n, WITNESS_SALT)
        return [i for i, position in enumerate(table) if position < self.witness_count]

    def trainer_indices(self) -> list[int]:
        return [i for i in range(self.n) if self.committee_of(i).committee is Committee.Trainer]

    def verify_committee(self, proof: CommitteeProof) -> bool:
        return 0 <= proof.index < self.n and self.committee_of(proof.index) == proof

    def verify_witness(self, proof: WitnessProof) -> bool:
        return 0 <= proof.index < self.n and self.witness_of(proof.index) == proof
