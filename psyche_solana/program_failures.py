"""Which program a failed transaction failed in, and its error in that program's words.

A custom error code means nothing without its program: code 1 is the System program's
ResultWithNegativeLamports (a wallet short of SOL), SPL Token's InsufficientFunds, and our
coordinator's Halted. The program is the innermost one that failed, which the logs name
("Program <id> failed: ..."; the first such line, since the invoking programs fail after
it), else the failed top-level instruction's. Each error says what to do in one line.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from solders.pubkey import Pubkey

from psyche_solana.accounts import COORDINATOR_ACCOUNT_SIZE, INSTANCE_SIZE
from psyche_solana.errors import describe, error_name
from psyche_solana.ids import (
    ASSOCIATED_TOKEN_PROGRAM_ID,
    PROGRAMS,
    SYSTEM_PROGRAM_ID,
    TOKEN_PROGRAM_ID,
    program_id,
    treasurer_program,
)

if TYPE_CHECKING:
    from psyche_solana.rpc import SolanaRpc

LAMPORTS_PER_SOL = 10**9
FUND_HINT = ("fund it (`run-manager wallet airdrop 1` on a local or test cluster, or a "
             "transfer from another wallet) and retry")

# solana_program::system_instruction::SystemError, in order
SYSTEM_ERRORS = dict(enumerate([
    "AccountAlreadyInUse", "ResultWithNegativeLamports", "InvalidProgramId",
    "InvalidAccountDataLength", "MaxSeedLengthExceeded", "AddressWithSeedMismatch",
    "NonceNoRecentBlockhashes", "NonceBlockhashNotExpired", "NonceUnexpectedBlockhashValue",
]))
# spl_token::error::TokenError, in order
TOKEN_ERRORS = dict(enumerate([
    "NotRentExempt", "InsufficientFunds", "InvalidMint", "MintMismatch", "OwnerMismatch",
    "FixedSupply", "AlreadyInUse", "InvalidNumberOfProvidedSigners",
    "InvalidNumberOfRequiredSigners", "UninitializedState", "NativeNotSupported",
    "NonNativeHasBalance", "InvalidInstruction", "InvalidState", "Overflow",
    "AuthorityTypeNotSupported", "MintCannotFreeze", "AccountFrozen", "MintDecimalsMismatch",
    "NonNativeNotSupported",
]))
ASSOCIATED_TOKEN_ERRORS = {0: "InvalidOwner"}
_SYSTEM_EXPLAIN = {
    "AccountAlreadyInUse": "the account to create exists already (retry: a new address is "
                           "picked each time)",
}
_TOKEN_EXPLAIN = {
    "MintMismatch": "the token account holds another token than this run's reward token",
    "OwnerMismatch": "the token account belongs to another wallet",
    "AccountFrozen": "the token account is frozen by the token's freeze authority",
}
_SHORT_OF_SOL = re.compile(r"insufficient lamports (\d+), need (\d+)")
_FAILED = re.compile(r"^Program (\w+) failed: ")


def sol(lamports: int) -> str:
    """Lamports as SOL, to 4 decimals at least and up to 9 (no trailing zeros beyond 4)."""
    text = f"{lamports / LAMPORTS_PER_SOL:.9f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(4, '0')} SOL"


def failed_program(logs: Sequence[str], top_level: Pubkey | None) -> Pubkey | None:
    """The innermost program that failed: the first "Program X failed" log line, else the
    failed top-level instruction's program (None when neither is known)."""
    for line in logs:
        if (match := _FAILED.match(line)) is not None:
            with contextlib.suppress(ValueError):
                return Pubkey.from_string(match.group(1))
    return top_level


def our_program_name(program: Pubkey) -> str | None:
    """"coordinator", "treasurer", ... for one of our programs; None for any other."""
    for name in PROGRAMS:
        with contextlib.suppress(OSError, ValueError):  # a program whose key is not here
            if program_id(name) == program:
                return name
    return None


def describe_failure(code: int, failed: Pubkey | None, top_level: Pubkey | None,
                     logs: Sequence[str], payer: Pubkey | None = None) -> tuple[str, str]:
    """(the error's name, a one-line message naming the program and what to do) for
    custom error `code` raised by program `failed` in a top-level instruction of
    `top_level`."""
    if failed == SYSTEM_PROGRAM_ID:
        name = SYSTEM_ERRORS.get(code, f"SystemError{code}")
        explanation = _SYSTEM_EXPLAIN.get(name)
        if name == "ResultWithNegativeLamports":
            explanation = short_of_sol(logs, payer)
        return name, f"System program error {code} ({name})" + (
            f": {explanation}" if explanation else "")
    if failed == TOKEN_PROGRAM_ID:
        name = TOKEN_ERRORS.get(code, f"TokenError{code}")
        explanation = _TOKEN_EXPLAIN.get(name)
        if name == "InsufficientFunds":
            explanation = (
                "the run's reward vault holds fewer reward tokens than this claim is owed; "
                "the run's owner must top it up (treasurer-top-up-rewards), then claim again"
                if top_level is not None and top_level == _treasurer() else
                "the sending token account holds fewer tokens than this transfer sends")
        return name, f"token program error {code} ({name})" + (
            f": {explanation}" if explanation else "")
    if failed == ASSOCIATED_TOKEN_PROGRAM_ID:
        name = ASSOCIATED_TOKEN_ERRORS.get(code, f"AssociatedTokenError{code}")
        return name, f"associated token program error {code} ({name})"
    ours = None if failed is None else our_program_name(failed)
    if failed is not None and ours is None:
        return f"Error{code}", f"program {failed} error {code} (not one of Psyche's programs)"
    # ours, or unknown (a confirmation's status carries no logs): our table
    return error_name(code), f"{ours + ' ' if ours else ''}program error {code}: {describe(code)}"


def short_of_sol(logs: Sequence[str], payer: Pubkey | None) -> str:
    """What a System transfer short of lamports says: who is short, by how much, what to do."""
    wallet = f"wallet {payer}" if payer is not None else "paying wallet"
    for line in logs:
        if (match := _SHORT_OF_SOL.search(line)) is not None:
            held, needed = int(match.group(1)), int(match.group(2))
            return (f"the {wallet} had {sol(held)} left for a transfer of {sol(needed)} (a new "
                    f"account's rent, at least): {FUND_HINT}")
    return f"the {wallet} holds too little SOL for this transaction: {FUND_HINT}"


async def run_rent_shortfall(rpc: SolanaRpc, wallet: Pubkey) -> str:
    """create-run's words for a wallet short of SOL: what it holds and what a run costs."""
    held = await rpc.balance(wallet)
    rent = (await rpc.minimum_balance(COORDINATOR_ACCOUNT_SIZE)
            + await rpc.minimum_balance(INSTANCE_SIZE))
    return (f"the wallet {wallet} holds {sol(held)}; a run needs about "
            f"{rent / LAMPORTS_PER_SOL:.2f} SOL of rent (its coordinator account and run-id "
            f"claim) and fees: {FUND_HINT}")


def _treasurer() -> Pubkey | None:
    with contextlib.suppress(OSError, ValueError):
        return treasurer_program()
    return None
