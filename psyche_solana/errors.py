"""Custom error codes of our programs, as words (programs/errors.h and the state-machine
errors of programs/coordinator_machine.h, which reuse coordinator.CoordinatorError names;
the distributor's own from 300 and the mining pool's from 6000, as their C sources number
them). The ranges never overlap, so one table names an error of any of our programs.
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
# the mining pool's own (programs/mining_pool.c, enum PoolError): Psyche's Anchor error
# codes from 6000, then the checks Anchor's account constraints make, named, from 6100
MINING_POOL_ERRORS = {
    6000: "ParamsCollateralAmountIsTooLarge", 6001: "ParamsRedeemableAmountIsTooLarge",
    6002: "ParamsMetadataLengthIsTooLarge", 6003: "PoolClaimingEnabledIsTrue",
    6004: "PoolClaimingEnabledIsFalse", 6005: "PoolFreezeIsTrue",
    6006: "PoolTotalDepositedCollateralAmountIsZero",
    6100: "NotPoolAuthority", 6101: "WrongLender", 6102: "WrongPoolVault",
    6103: "WrongTokenAccount", 6104: "WrongRedeemableMint", 6105: "WrongPoolAddress",
}
MINING_POOL_METADATA_MAX = 400
PROGRAM_ERRORS: dict[int, str] = {**_MACHINE, **{100 + i: name for i, name in enumerate(_PROGRAM)},
                                  **{300 + i: name for i, name in enumerate(_DISTRIBUTOR)},
                                  **MINING_POOL_ERRORS}
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
    "ParamsCollateralAmountIsTooLarge":
        "the deposit would pass the pool's maximum (see pool-show; the authority raises it "
        "with pool-update --max-deposit)",
    "ParamsRedeemableAmountIsTooLarge":
        "more than this lender's unclaimed share of the rewards (already claimed?)",
    "ParamsMetadataLengthIsTooLarge": f"metadata is at most {MINING_POOL_METADATA_MAX} bytes",
    "PoolClaimingEnabledIsTrue": "claims are already enabled for this pool (and it takes no "
                                 "more deposits)",
    "PoolClaimingEnabledIsFalse": "the pool's authority has not enabled claims yet (pool-claimable)",
    "PoolFreezeIsTrue": "the pool is frozen (its authority unfreezes it with pool-update --unfreeze)",
    "PoolTotalDepositedCollateralAmountIsZero": "nobody deposited into this pool",
    "NotPoolAuthority": "only the pool's authority may do this (sign with its wallet)",
    "WrongLender": "the lender account is not this wallet's in this pool (pool-deposit creates it)",
    "WrongPoolVault": "the vault is not the pool's associated token account of the mint",
    "WrongTokenAccount": "the token account is not the signer's, of the pool's mint, without "
                         "a delegate",
    "WrongRedeemableMint": "the reward mint is not the pool's",
    "WrongPoolAddress": "the pool account is not the PDA of this index",
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
