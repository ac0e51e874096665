"""Run administration over JSON-RPC: what the run-manager's Solana subcommands do.

Every function takes a `SolanaRpc` and keypairs, builds instructions with
psyche_solana.instructions and waits for confirmation; failures raise
`rpc.ProgramError` naming the on-chain error. A run id is claimed once, on-chain, by the
coordinator instance PDA ["coordinator", run_id] that init_coordinator creates, and runs
are found through it (never by searching accounts for the run id, which anyone could
copy). A run "has a treasurer" iff the Run PDA of its treasurer index (default: first 8
bytes LE of SHA-256(run_id)) exists and names the run's coordinator account.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from solders.instruction import Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from coordinator.config import StateFile
from psyche_solana import instructions as ix
from psyche_solana.accounts import (
    COORDINATOR_ACCOUNT_SIZE,
    COORDINATOR_MAGIC,
    AccountDecodeError,
    Authorization,
    CoordinatorAccount,
    TreasurerRun,
    decode_authorization,
    decode_coordinator,
    decode_instance,
    decode_participant,
    decode_treasurer_run,
)
from psyche_solana.ids import coordinator_program
from psyche_solana.rpc import SolanaRpc

log = logging.getLogger(__name__)


class RunNotFound(LookupError):
    pass


class RunIdTaken(ValueError):
    """create-run with a run id that is already claimed on this cluster."""


@dataclass
class RunHandle:
    address: Pubkey                # the coordinator account
    account: CoordinatorAccount
    treasurer_index: int | None
    treasurer: TreasurerRun | None
    instance: Pubkey               # the run id's claim, ["coordinator", run_id]


async def run_address(rpc: SolanaRpc, run_id: str) -> tuple[Pubkey, Pubkey] | None:
    """(instance, coordinator account) of `run_id`, or None if the id is unclaimed."""
    instance = ix.coordinator_instance_address(run_id)
    data = await rpc.account_data(instance)
    if not data:
        return None  # unclaimed (or only lamports sent to the address: still claimable)
    claim = decode_instance(data)
    if claim.run_id != run_id:
        raise AccountDecodeError(f"the claim of {run_id!r} names run id {claim.run_id!r}")
    return instance, claim.coordinator_account


async def find_run(rpc: SolanaRpc, run_id: str, treasurer_index: int | None = None) -> RunHandle:
    found = await run_address(rpc, run_id)
    if found is None:
        raise RunNotFound(f"no run {run_id!r} on this cluster (see list-runs)")
    instance, address = found
    data = await rpc.account_data(address)
    if data is None:
        raise RunNotFound(f"run {run_id!r}: its coordinator account {address} is gone")
    account = decode_coordinator(data)
    if account.run_id != run_id:
        raise AccountDecodeError(f"coordinator account {address} holds run {account.run_id!r}, "
                                 f"not {run_id!r}")
    index = treasurer_index if treasurer_index is not None else ix.default_treasurer_index(run_id)
    treasurer_data = await rpc.account_data(ix.treasurer_run_address(index))
    treasurer = decode_treasurer_run(treasurer_data) if treasurer_data else None
    if treasurer is not None and treasurer.coordinator_account != address:
        treasurer = None
    return RunHandle(address, account, index if treasurer else None, treasurer, instance)


async def list_runs(rpc: SolanaRpc) -> list[tuple[Pubkey, CoordinatorAccount]]:
    """Every initialized coordinator account: each holds a distinct run id, since
    init_coordinator claims the id. An account that does not decode is skipped (anyone
    can create program-owned accounts of this size; they must not hide the others)."""
    found = await rpc.program_accounts(coordinator_program(), COORDINATOR_ACCOUNT_SIZE,
                                       [(0, COORDINATOR_MAGIC)])
    runs = []
    for address, data in found:
        try:
            runs.append((address, decode_coordinator(data)))
        except AccountDecodeError as exc:
            log.warning("skipping coordinator account %s: %s", address, exc)
    return runs


async def create_run(rpc: SolanaRpc, payer: Keypair, run_id: str, client_version: str,
                     join_authority: Pubkey | None = None, treasurer_index: int | None = None,
                     collateral_mint: Pubkey | None = None) -> Pubkey:
    """A coordinator account owned by the program, claiming `run_id`; with a collateral
    mint, created through the treasurer (its Run PDA is the run's authority) with a
    reward vault. RunIdTaken if the id is claimed (on-chain, AlreadyInitialized)."""
    taken = await run_address(rpc, run_id)
    if taken is not None:
        raise RunIdTaken(f"run id {run_id!r} is already taken (coordinator account "
                         f"{taken[1]}): pick another")
    account = Keypair()
    rent = await rpc.minimum_balance(COORDINATOR_ACCOUNT_SIZE)
    create = ix.create_coordinator_account(payer.pubkey(), account.pubkey(), rent)
    join = join_authority or payer.pubkey()
    if collateral_mint is not None:
        index = treasurer_index if treasurer_index is not None else ix.default_treasurer_index(run_id)
        run_pda = ix.treasurer_run_address(index)
        instructions = [create, ix.treasurer_run_create(
            payer.pubkey(), index, account.pubkey(), run_id, payer.pubkey(), join, client_version,
            collateral_mint), ix.create_associated_token_account(payer.pubkey(), run_pda,
                                                                 collateral_mint)]
    else:
        instructions = [create, ix.init_coordinator(account.pubkey(), payer.pubkey(), run_id,
                                                    payer.pubkey(), join, client_version)]
    await rpc.send_instructions(instructions, payer, [account])
    return account.pubkey()


async def admin(rpc: SolanaRpc, run: RunHandle, authority: Keypair,
                instructions: Sequence[Instruction]) -> None:
    """Admin coordinator instructions, one transaction each, forwarded by the treasurer
    for treasurer runs."""
    for inner in instructions:
        outer = inner if run.treasurer_index is None else ix.treasurer_run_update(
            authority.pubkey(), run.treasurer_index, run.address, inner)
        await rpc.send_instructions([outer], authority)


def update_instructions(run: RunHandle, authority: Pubkey, state_file: StateFile | None,
                        client_version: str | None) -> list[Instruction]:
    out: list[Instruction] = []
    if state_file is not None:
        out.append(ix.update_config(run.address, authority, state_file.config))
        out += ix.update_model(run.address, authority, state_file.model)
    if client_version is not None:
        out.append(ix.update_client_version(run.address, authority, client_version))
    return out


async def authorize(rpc: SolanaRpc, grantor: Keypair, grantee: Pubkey) -> Pubkey:
    address = ix.authorization_address(grantor.pubkey(), grantee)
    await rpc.send_instructions([
        ix.authorization_create(grantor.pubkey(), grantor.pubkey(), grantee),
        ix.authorization_grantor_update(grantor.pubkey(), address, True)], grantor)
    return address


async def read_authorization(rpc: SolanaRpc, grantor: Pubkey, grantee: Pubkey) -> Authorization | None:
    data = await rpc.account_data(ix.authorization_address(grantor, grantee))
    return decode_authorization(data) if data else None


async def can_join(rpc: SolanaRpc, run: RunHandle, user: Pubkey,
                   authorizer: Pubkey | None = None) -> tuple[bool, str]:
    """Whether `user` may join: an active authorization (for the user, for `authorizer`
    listing the user as delegate, or permissionless) and a run that is not halted."""
    grantor = run.account.join_authority
    for grantee in [g for g in (authorizer, user, Pubkey.default()) if g is not None]:
        authorization = await read_authorization(rpc, grantor, grantee)
        if authorization is not None and authorization.is_valid_for(user):
            if run.account.run_state.halted:
                return False, f"authorized (grantee {grantee}), but the run is {run.account.run_state.name}"
            return True, f"authorized by grantee {grantee}"
    return False, f"no active join authorization from {grantor} covers {user}"


async def mint_decimals(rpc: SolanaRpc, mint: Pubkey) -> int:
    data = await rpc.account_data(mint)
    if data is None or len(data) < 45:
        raise ValueError(f"{mint} is not an SPL token mint")
    return data[44]


async def top_up(rpc: SolanaRpc, run: RunHandle, payer: Keypair, amount: int) -> int:
    """Transfer `amount` base units of collateral from the payer's token account."""
    if run.treasurer is None or run.treasurer_index is None:
        raise ValueError("this run has no treasurer (create it with --treasurer-collateral-mint)")
    mint = run.treasurer.collateral_mint
    decimals = await mint_decimals(rpc, mint)
    vault = ix.associated_token_address(ix.treasurer_run_address(run.treasurer_index), mint)
    await rpc.send_instructions([ix.token_transfer_checked(
        ix.associated_token_address(payer.pubkey(), mint), mint, vault, payer.pubkey(), amount,
        decimals)], payer)
    return amount


async def claimable(rpc: SolanaRpc, run: RunHandle, user: Pubkey) -> tuple[int, int]:
    """(earned points, already claimed points)."""
    claimed = 0
    if run.treasurer_index is not None:
        data = await rpc.account_data(ix.participant_address(
            ix.treasurer_run_address(run.treasurer_index), user))
        claimed = decode_participant(data).claimed_earned_points if data else 0
    return run.account.earned(user), claimed


async def claim(rpc: SolanaRpc, run: RunHandle, user: Keypair, points: int | None = None) -> int:
    if run.treasurer is None or run.treasurer_index is None:
        raise ValueError("this run has no treasurer: there are no rewards to claim")
    earned, claimed = await claimable(rpc, run, user.pubkey())
    amount = earned - claimed if points is None else points
    mint = run.treasurer.collateral_mint
    await rpc.send_instructions([
        ix.create_associated_token_account(user.pubkey(), user.pubkey(), mint),
        ix.treasurer_claim(user.pubkey(), run.treasurer_index, run.address, mint, amount)], user)
    return amount
