"""The distributor's Merkle tree, as Psyche's solana-distributor hashes it (pure and
deterministic; programs/distributor.c checks the same proofs on chain).

    leaf   = sha256(claimer[32] | nonce u64 | start i64 | duration u32 | amount u64)  (LE)
    parent = sha256(min(a, b) | max(a, b))       (the pair sorted bytewise)

A leaf hashes 60 bytes and a parent 64, so an inner node can never pass for a leaf.
Sorting each pair makes a proof a plain list of siblings, with no left/right flags. The
tree is built over the leaves in the order given; at a level with an odd count the last
node is carried up unchanged (its proof has no sibling at that level).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

HASH_SIZE = 32


@dataclass(frozen=True)
class Vesting:
    """Linear vesting: nothing before `start_unix_timestamp`, `end_collateral_amount` from
    start + `duration_seconds` on, linear (rounded down) in between."""
    start_unix_timestamp: int
    duration_seconds: int
    end_collateral_amount: int

    def __post_init__(self) -> None:
        if not -2**63 <= self.start_unix_timestamp < 2**63:
            raise ValueError(f"vesting start {self.start_unix_timestamp} is not an i64")
        if not 0 <= self.duration_seconds < 2**32:
            raise ValueError(f"vesting duration {self.duration_seconds} s is not a u32")
        if not 0 <= self.end_collateral_amount < 2**64:
            raise ValueError(f"amount {self.end_collateral_amount} is not a u64")

    def pack(self) -> bytes:
        return struct.pack("<qIQ", self.start_unix_timestamp, self.duration_seconds,
                           self.end_collateral_amount)

    def vested(self, now_unix_timestamp: int) -> int:
        """What has vested at `now` (the program's formula, to the base unit)."""
        if now_unix_timestamp < self.start_unix_timestamp:
            return 0
        if self.duration_seconds == 0:
            return self.end_collateral_amount
        elapsed = now_unix_timestamp - self.start_unix_timestamp
        return min(self.end_collateral_amount,
                   self.end_collateral_amount * elapsed // self.duration_seconds)


@dataclass(frozen=True)
class Allocation:
    """One recipient's line of an airdrop: (claimer, nonce) names its Claim account."""
    claimer: bytes  # 32-byte public key
    nonce: int
    vesting: Vesting

    def __post_init__(self) -> None:
        if len(self.claimer) != 32:
            raise ValueError("a claimer is a 32-byte public key")
        if not 0 <= self.nonce < 2**64:
            raise ValueError(f"nonce {self.nonce} is not a u64")

    def leaf(self) -> bytes:
        return leaf_hash(self.claimer, self.nonce, self.vesting)


def leaf_hash(claimer: bytes, nonce: int, vesting: Vesting) -> bytes:
    return hashlib.sha256(claimer + struct.pack("<Q", nonce) + vesting.pack()).digest()


def parent_hash(a: bytes, b: bytes) -> bytes:
    low, high = (a, b) if a <= b else (b, a)
    return hashlib.sha256(low + high).digest()


def verify(root: bytes, leaf: bytes, proof: Sequence[bytes]) -> bool:
    node = leaf
    for sibling in proof:
        node = parent_hash(node, sibling)
    return node == root


class MerkleTree:
    """The tree over `leaves` (at least one); `root` and `proof(i)` for leaf i."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        if not leaves:
            raise ValueError("a Merkle tree needs at least one leaf")
        if any(len(leaf) != HASH_SIZE for leaf in leaves):
            raise ValueError("every leaf is a 32-byte hash")
        self.levels: list[list[bytes]] = [list(leaves)]
        while len(self.levels[-1]) > 1:
            level = self.levels[-1]
            parents = [parent_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                parents.append(level[-1])
            self.levels.append(parents)

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    def proof(self, index: int) -> list[bytes]:
        if not 0 <= index < len(self.levels[0]):
            raise IndexError(f"no leaf {index} (the tree has {len(self.levels[0])})")
        siblings = []
        for level in self.levels[:-1]:
            sibling = index ^ 1
            if sibling < len(level):
                siblings.append(level[sibling])
            index //= 2
        return siblings
