"""Custom error codes of our programs, as words (programs/errors.h and the state-machine
errors of programs/coordinator_machine.h, which reuse coordinator.CoordinatorError names).
"""

from __future__ import annotations

from coordinator import CoordinatorError

_MACHINE = {i + 1: error.name for i, error in enumerate(CoordinatorError)}
_PROGRAM = [
    "InvalidInstruction", "MissingAccount", "MissingSignature", "WrongAccountOwner",
    "WrongAccountSize", "AlreadyInitialized", "NotInitialized", "NotMainAuthority",
    "NotAuthorized", "RegistryFull", "InvalidConfig", "InvalidModel", "NotHalted",
    "ModelNotSet", "WrongAccount", "AccountNotWritable", "TooManyDelegates",
    "AuthorizationActive", "NothingToClaim", "ClaimTooLarge", "WrongVault", "InvalidRunId",
    "NotAdminInstruction", "NotGrantor", "NotGrantee", "InvalidMetadata",
]
# the distributor's own (programs/distributor.c), from 300
_DISTRIBUTOR = [
    "AirdropClaimsFrozen", "WrongMerkleProof", "MerkleRootZeroed", "MoreThanVested",
    "NothingVestedYet", "NotAirdropAuthority", "AccountingOverflow",
]
PROGRAM_ERRORS: dict[int, str] = {**_MACHINE, **{100 + i: name for i, name in enumerate(_PROGRAM)},
                                  **{300 + i: name for i, name in enumerate(_DISTRIBUTOR)}}
CODES: dict[str, int] = {name: code for code, name in PROGRAM_ERRORS.items()}
_EXPLAIN = {
    "NotAuthorized": "no active join authorization for this key (ask the run's join authority)",
    "NotMainAuthority": "only the run's main authority may do this",
    "NothingToClaim": "no unclaimed reward points (already claimed?)",
    "ClaimTooLarge": "more points than earned and not yet claimed",
    "NotHalted": "the run must be paused (or not started) for this change",
    "ModelNotSet": "update-config must set the model before the run can start",
    "InvalidConfig": "the run config breaks a rule (see psyche-coordinator validate-config)",
    "InvalidMetadata": "the name is at most 64 bytes and the description at most 280, in UTF-8",
    "AirdropClaimsFrozen": "the airdrop's authority has frozen claims (airdrop-update unfreezes)",
    "WrongMerkleProof": "this wallet's allocation and proof do not match the airdrop's Merkle root "
                        "(use the proofs file written by airdrop-create, with the signing wallet)",
    "MerkleRootZeroed": "a Merkle root of 32 zero bytes is refused",
    "MoreThanVested": "more than has vested and is not yet claimed (try a smaller amount or later)",
    "NothingVestedYet": "nothing has vested yet (vesting has not started): claim later",
    "NotAirdropAuthority": "only the airdrop's authority may do this (sign with its wallet)",
    **{error.name: error.value for error in CoordinatorError},
}
TOKEN_ERRORS = {1: "InsufficientFunds", 3: "MintMismatch", 4: "OwnerMismatch"}


def error_name(code: int) -> str:
    return PROGRAM_ERRORS.get(code, f"UnknownError{code}")


def describe(code: int) -> str:
    """`Name: explanation` for a custom program error code."""
    name = error_name(code)
    explanation = _EXPLAIN.get(name)
    return f"{name}: {explanation}" if explanation else name
