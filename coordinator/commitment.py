"""Commitments of training results and the Merkle root of a witness
(docs/coordinator.md, "Commitments and Merkle roots").

    data_hash = SHA-256(step u32 BE || start u64 BE || end u64 BE || for each tensor: idx || val)
    leaf = SHA-256(0x00 || x);  node = SHA-256(0x01 || left || right)
    an odd node is paired with itself; the root of no leaves is 32 zero bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.shuffle import sha256

ZERO_HASH = bytes(32)


def data_hash(step: int, batch_start: int, batch_end: int,
              tensors: Iterable[tuple[bytes, bytes]]) -> bytes:
    parts = [step.to_bytes(4, "big"), batch_start.to_bytes(8, "big"), batch_end.to_bytes(8, "big")]
    for indices, values in tensors:
        parts += [indices, values]
    return sha256(*parts)


def merkle_root(items: Iterable[bytes]) -> bytes:
    level = [sha256(b"\x00", item) for item in items]
    if not level:
        return ZERO_HASH
    while len(level) > 1:
        if len(level) % 2:
            level.append(level[-1])
        level = [sha256(b"\x01", level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def finished_hash(accepted_broadcast_hashes: Iterable[bytes]) -> bytes:
    """Hash a `Finished` broadcast commits to: SHA-256 of the Merkle root, arrival order."""
    return sha256(merkle_root(accepted_broadcast_hashes))


def participant_item(signer: bytes) -> bytes:
    """What a witness inserts in participant_bloom for a verified sender."""
    return sha256(signer)
