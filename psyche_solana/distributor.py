"""The distributor program (programs/distributor.c): a Merkle airdrop with linear vesting,
with Psyche's accounts, seeds and Anchor instruction encoding.

Addresses, instruction builders, account decoders (pure), then the few RPC steps the
run-manager's airdrop commands are made of. The Merkle tree is psyche_solana.merkle.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from solders.sysvar import CLOCK

from psyche_solana.ids import (
    ASSOCIATED_TOKEN_PROGRAM_ID,
    SYSTEM_PROGRAM_ID,
    TOKEN_PROGRAM_ID,
    distributor_program,
)
from psyche_solana.instructions import (
    associated_token_address,
    create_associated_token_account,
    token_amount,
    token_transfer_checked,
)
from psyche_solana.merkle import Allocation, Vesting, verify
from psyche_solana.rpc import SolanaRpc

METADATA_SIZE = 300
AIRDROP_SIZE = 422
CLAIM_SIZE = 17
MAX_PROOF = 32  # the program's limit; 2^32 leaves


def _anchor(namespace: str, name: str) -> bytes:
    """Anchor's discriminator: the first 8 bytes of sha256("<namespace>:<name>")."""
    return hashlib.sha256(f"{namespace}:{name}".encode()).digest()[:8]


AIRDROP_DISCRIMINATOR = _anchor("account", "Airdrop")
CLAIM_DISCRIMINATOR = _anchor("account", "Claim")


def _meta(key: Pubkey, signer: bool = False, writable: bool = False) -> AccountMeta:
    return AccountMeta(key, is_signer=signer, is_writable=writable)


def _u64(value: int, what: str) -> bytes:
    if not 0 <= value < 2**64:
        raise ValueError(f"{what} {value} is not a u64")
    return struct.pack("<Q", value)


# ------------------------------------------------------------------- addresses
def airdrop_address(airdrop_id: int) -> Pubkey:
    address, _bump = Pubkey.find_program_address(
        [b"Airdrop", _u64(airdrop_id, "airdrop id")], distributor_program())
    return address


def claim_address(airdrop: Pubkey, claimer: Pubkey, nonce: int) -> Pubkey:
    address, _bump = Pubkey.find_program_address(
        [b"Claim", bytes(airdrop), bytes(claimer), _u64(nonce, "nonce")], distributor_program())
    return address


def vault_address(airdrop_id: int, mint: Pubkey) -> Pubkey:
    return associated_token_address(airdrop_address(airdrop_id), mint)


def default_airdrop_id(merkle_root: bytes) -> int:
    """An id that needs no bookkeeping: the first 8 bytes of the root, little-endian."""
    return int.from_bytes(merkle_root[:8], "little")


# ---------------------------------------------------------------- instructions
def airdrop_create(payer: Pubkey, authority: Pubkey, airdrop_id: int, mint: Pubkey,
                   merkle_root: bytes, metadata: bytes = b"") -> Instruction:
    if len(merkle_root) != 32:
        raise ValueError("the Merkle root is 32 bytes")
    if len(metadata) > METADATA_SIZE:
        raise ValueError(f"metadata is {len(metadata)} bytes, at most {METADATA_SIZE}")
    airdrop = airdrop_address(airdrop_id)
    data = (_anchor("global", "airdrop_create") + _u64(airdrop_id, "airdrop id") + merkle_root
            + metadata.ljust(METADATA_SIZE, b"\0"))
    return Instruction(distributor_program(), data, [
        _meta(payer, True, True), _meta(authority, True), _meta(airdrop, writable=True),
        _meta(associated_token_address(airdrop, mint), writable=True), _meta(mint),
        _meta(ASSOCIATED_TOKEN_PROGRAM_ID), _meta(TOKEN_PROGRAM_ID), _meta(SYSTEM_PROGRAM_ID)])


def _option(value: bytes | None) -> bytes:
    return b"\0" if value is None else b"\1" + value


def airdrop_update(authority: Pubkey, airdrop_id: int, claim_freeze: bool | None = None,
                   merkle_root: bytes | None = None, metadata: bytes | None = None) -> Instruction:
    if merkle_root is not None and len(merkle_root) != 32:
        raise ValueError("the Merkle root is 32 bytes")
    if metadata is not None and len(metadata) > METADATA_SIZE:
        raise ValueError(f"metadata is {len(metadata)} bytes, at most {METADATA_SIZE}")
    data = (_anchor("global", "airdrop_update")
            + _option(None if claim_freeze is None else bytes([claim_freeze]))
            + _option(merkle_root)
            + _option(None if metadata is None else metadata.ljust(METADATA_SIZE, b"\0")))
    return Instruction(distributor_program(), data, [
        _meta(authority, True), _meta(airdrop_address(airdrop_id), writable=True)])


def airdrop_withdraw(authority: Pubkey, airdrop_id: int, mint: Pubkey, receiver: Pubkey,
                     amount: int) -> Instruction:
    """Move `amount` base units from the vault to the token account `receiver`."""
    airdrop = airdrop_address(airdrop_id)
    return Instruction(distributor_program(),
                       _anchor("global", "airdrop_withdraw") + _u64(amount, "amount"), [
        _meta(authority, True), _meta(receiver, writable=True), _meta(airdrop, writable=True),
        _meta(associated_token_address(airdrop, mint), writable=True), _meta(mint),
        _meta(TOKEN_PROGRAM_ID), _meta(ASSOCIATED_TOKEN_PROGRAM_ID), _meta(SYSTEM_PROGRAM_ID)])


def claim_create(payer: Pubkey, claimer: Pubkey, airdrop_id: int, nonce: int = 0) -> Instruction:
    airdrop = airdrop_address(airdrop_id)
    return Instruction(distributor_program(),
                       _anchor("global", "claim_create") + _u64(nonce, "nonce"), [
        _meta(payer, True, True), _meta(claimer, True), _meta(airdrop),
        _meta(claim_address(airdrop, claimer, nonce), writable=True), _meta(SYSTEM_PROGRAM_ID)])


def claim_redeem(claimer: Pubkey, airdrop_id: int, mint: Pubkey, receiver: Pubkey, nonce: int,
                 vesting: Vesting, amount: int, proof: Sequence[bytes]) -> Instruction:
    """Redeem `amount` base units of the allocation (claimer, nonce, vesting), proven by
    `proof`, into the token account `receiver`."""
    if len(proof) > MAX_PROOF or any(len(node) != 32 for node in proof):
        raise ValueError(f"a proof is at most {MAX_PROOF} hashes of 32 bytes")
    airdrop = airdrop_address(airdrop_id)
    data = (_anchor("global", "claim_redeem") + _u64(nonce, "nonce") + vesting.pack()
            + _u64(amount, "amount") + struct.pack("<I", len(proof)) + b"".join(proof))
    return Instruction(distributor_program(), data, [
        _meta(claimer, True), _meta(receiver, writable=True), _meta(airdrop, writable=True),
        _meta(associated_token_address(airdrop, mint), writable=True), _meta(mint),
        _meta(claim_address(airdrop, claimer, nonce), writable=True), _meta(TOKEN_PROGRAM_ID)])


# -------------------------------------------------------------------- accounts
@dataclass(frozen=True)
class Airdrop:
    bump: int
    id: int
    authority: Pubkey
    collateral_mint: Pubkey
    total_claimed_collateral_amount: int
    claim_freeze: bool
    merkle_root: bytes
    metadata: bytes


@dataclass(frozen=True)
class Claim:
    bump: int
    claimed_collateral_amount: int


def decode_airdrop(data: bytes) -> Airdrop:
    if len(data) != AIRDROP_SIZE or data[:8] != AIRDROP_DISCRIMINATOR:
        raise ValueError("not a distributor Airdrop account")
    bump, airdrop_id = struct.unpack_from("<BQ", data, 8)
    total, freeze = struct.unpack_from("<QB", data, 81)
    return Airdrop(bump, airdrop_id, Pubkey.from_bytes(data[17:49]),
                   Pubkey.from_bytes(data[49:81]), total, bool(freeze), data[90:122],
                   data[122:422].rstrip(b"\0"))


def decode_claim(data: bytes) -> Claim:
    if len(data) != CLAIM_SIZE or data[:8] != CLAIM_DISCRIMINATOR:
        raise ValueError("not a distributor Claim account")
    bump, claimed = struct.unpack_from("<BQ", data, 8)
    return Claim(bump, claimed)


# ------------------------------------------------------------------ RPC steps
@dataclass(frozen=True)
class ProvenAllocation:
    """A line of a proofs file: the allocation and its proof against the root."""
    allocation: Allocation
    proof: list[bytes]

    @property
    def claimer(self) -> Pubkey:
        return Pubkey.from_bytes(self.allocation.claimer)


async def cluster_time(rpc: SolanaRpc) -> int:
    """The cluster's clock (the Clock sysvar's unix_timestamp): vesting follows it."""
    data = await rpc.account_data(CLOCK)
    if data is None or len(data) < 40:
        raise ValueError("the cluster has no Clock sysvar account")
    return int(struct.unpack_from("<q", data, 32)[0])


async def load_airdrop(rpc: SolanaRpc, airdrop_id: int) -> Airdrop:
    data = await rpc.account_data(airdrop_address(airdrop_id))
    if data is None:
        raise ValueError(f"distributor: no airdrop with id {airdrop_id} "
                         f"({airdrop_address(airdrop_id)}); check --airdrop-id and --rpc")
    return decode_airdrop(data)


async def vault_balance(rpc: SolanaRpc, airdrop: Airdrop) -> int:
    data = await rpc.account_data(vault_address(airdrop.id, airdrop.collateral_mint))
    return token_amount(data) if data is not None else 0


async def claimed_amount(rpc: SolanaRpc, airdrop_id: int, claimer: Pubkey, nonce: int) -> int | None:
    """What the claim (claimer, nonce) has redeemed; None when it was never created."""
    data = await rpc.account_data(claim_address(airdrop_address(airdrop_id), claimer, nonce))
    return None if data is None else decode_claim(data).claimed_collateral_amount


async def create_and_fund(rpc: SolanaRpc, authority: Keypair, airdrop_id: int, mint: Pubkey,
                          merkle_root: bytes, fund: int, decimals: int,
                          metadata: bytes = b"") -> None:
    """Create the airdrop (and its vault), then move `fund` base units into the vault from
    the authority's associated token account (none when 0)."""
    await rpc.send_instructions([airdrop_create(authority.pubkey(), authority.pubkey(),
                                                airdrop_id, mint, merkle_root, metadata)],
                                authority)
    if fund:
        source = associated_token_address(authority.pubkey(), mint)
        await rpc.send_instructions([token_transfer_checked(
            source, mint, vault_address(airdrop_id, mint), authority.pubkey(), fund, decimals)],
            authority)


async def redeem(rpc: SolanaRpc, claimer: Keypair, airdrop_id: int, line: ProvenAllocation,
                 amount: int | None) -> int:
    """Redeem `amount` (None: all that is claimable now) of `line` for `claimer`, creating
    its Claim account and its token account first when missing; the amount sent."""
    airdrop = await load_airdrop(rpc, airdrop_id)
    if not verify(airdrop.merkle_root, line.allocation.leaf(), line.proof):
        raise ValueError(f"distributor: the proof for {line.claimer} does not match airdrop "
                         f"{airdrop_id}'s Merkle root; use the proofs file of this airdrop")
    nonce, mint = line.allocation.nonce, airdrop.collateral_mint
    claimed = await claimed_amount(rpc, airdrop_id, claimer.pubkey(), nonce)
    setup = [create_associated_token_account(claimer.pubkey(), claimer.pubkey(), mint)]
    if claimed is None:
        setup.append(claim_create(claimer.pubkey(), claimer.pubkey(), airdrop_id, nonce))
    if amount is None:
        vested = line.allocation.vesting.vested(await cluster_time(rpc))
        amount = max(0, vested - (claimed or 0))
        if amount == 0:
            raise ValueError("distributor: nothing to claim now (nothing vested yet, or all "
                             "that has vested is claimed): claim later")
    await rpc.send_instructions([*setup, claim_redeem(
        claimer.pubkey(), airdrop_id, mint, associated_token_address(claimer.pubkey(), mint),
        nonce, line.allocation.vesting, amount, line.proof)], claimer)
    return amount


async def withdraw(rpc: SolanaRpc, authority: Keypair, airdrop_id: int, amount: int | None) -> int:
    """Claw back `amount` (None: all the vault holds) into the authority's token account."""
    airdrop = await load_airdrop(rpc, airdrop_id)
    if amount is None:
        amount = await vault_balance(rpc, airdrop)
    mint = airdrop.collateral_mint
    await rpc.send_instructions([
        create_associated_token_account(authority.pubkey(), authority.pubkey(), mint),
        airdrop_withdraw(authority.pubkey(), airdrop_id, mint,
                         associated_token_address(authority.pubkey(), mint), amount)], authority)
    return amount


async def update(rpc: SolanaRpc, authority: Keypair, airdrop_id: int,
                 claim_freeze: bool | None = None, merkle_root: bytes | None = None,
                 metadata: bytes | None = None, allocated_total: int | None = None,
                 decimals: int = 0) -> int:
    """Change what the authority may change of an airdrop (Psyche's airdrop_update: the
    claim freeze, the Merkle root, the metadata; None leaves each as it is). With
    `allocated_total` (the new allocations' total), then top the vault up to what they
    still owe (that total less what has been claimed so far) from the authority's
    associated token account. The base units moved into the vault (0 when it held enough)."""
    await rpc.send_instructions([airdrop_update(authority.pubkey(), airdrop_id, claim_freeze,
                                                merkle_root, metadata)], authority)
    if allocated_total is None:
        return 0
    airdrop = await load_airdrop(rpc, airdrop_id)
    owed = max(0, allocated_total - airdrop.total_claimed_collateral_amount)
    top_up = max(0, owed - await vault_balance(rpc, airdrop))
    if top_up:
        mint = airdrop.collateral_mint
        await rpc.send_instructions([token_transfer_checked(
            associated_token_address(authority.pubkey(), mint), mint,
            vault_address(airdrop_id, mint), authority.pubkey(), top_up, decimals)], authority)
    return top_up
