"""The mining pool program (programs/mining_pool.c): instruction builders, account
decoders, the lender-share formula and the program's error names.

A pool's authority (a delegate raising funds for a run) creates the pool, lenders
deposit collateral up to the pool's maximum, the authority extracts the collateral to buy
compute, then deposits the reward tokens the run earned into the pool's vault and enables
claims; each lender claims `floor((claimed_total + vault) * deposited / total_deposited)`
in all. Accounts and PDA seeds are Psyche's (`["Pool", index LE]`,
`["Lender", pool, user]`, Anchor discriminators, Borsh fields), so the same bytes decode
with Psyche's tools and with `decode_pool` / `decode_lender` here.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from solders.instruction import AccountMeta, Instruction
from solders.pubkey import Pubkey

from psyche_solana import errors as program_errors
from psyche_solana.ids import (
    ASSOCIATED_TOKEN_PROGRAM_ID,
    SYSTEM_PROGRAM_ID,
    TOKEN_PROGRAM_ID,
    mining_pool_program,
)
from psyche_solana.instructions import associated_token_address

METADATA_MAX = program_errors.MINING_POOL_METADATA_MAX
POOL_SPACE = 560    # 8 + Rust's size_of::<Pool>() (549 bytes used, padded as Anchor sizes it)
LENDER_SPACE = 32   # 8 + size_of::<Lender>() (25 used)
POOL_DISCRIMINATOR = hashlib.sha256(b"account:Pool").digest()[:8]
LENDER_DISCRIMINATOR = hashlib.sha256(b"account:Lender").digest()[:8]
_POOL = struct.Struct("<8sBQ32s32sQQQ?32sQ?H400s")
_LENDER = struct.Struct("<8sBQQ")

# The program's error names live in the shared table (psyche_solana.errors), so that a
# refusal names its error whichever path reports it; these are its views of them.
ERRORS = program_errors.MINING_POOL_ERRORS
CODES = {name: code for code, name in ERRORS.items()}


def error_name(code: int) -> str:
    """The mining pool's name for a custom error code (the shared ones included)."""
    return program_errors.error_name(code)


def describe(code: int) -> str:
    """`Name: explanation` for an error of the mining pool program."""
    return program_errors.describe(code)


def pool_address(index: int) -> Pubkey:
    return Pubkey.find_program_address([b"Pool", index.to_bytes(8, "little")],
                                       mining_pool_program())[0]


def lender_address(pool: Pubkey, user: Pubkey) -> Pubkey:
    return Pubkey.find_program_address([b"Lender", bytes(pool), bytes(user)],
                                       mining_pool_program())[0]


def _meta(key: Pubkey, signer: bool = False, writable: bool = False) -> AccountMeta:
    return AccountMeta(key, signer, writable)


def metadata_bytes(metadata: bytes) -> bytes:
    """Psyche's PoolMetadata: length u16 | bytes[400]."""
    if len(metadata) > METADATA_MAX:
        raise ValueError(f"pool metadata is {len(metadata)} bytes, at most {METADATA_MAX}")
    return struct.pack("<H", len(metadata)) + metadata.ljust(METADATA_MAX, b"\0")


def _ix(tag: int, params: bytes, metas: list[AccountMeta]) -> Instruction:
    return Instruction(mining_pool_program(), bytes([tag]) + params, metas)


def pool_create(payer: Pubkey, authority: Pubkey, index: int, collateral_mint: Pubkey,
                metadata: bytes = b"") -> Instruction:
    """Create pool `index` (max deposit 0 until pool_update sets it) and its vault."""
    pool = pool_address(index)
    return _ix(0, struct.pack("<Q", index) + metadata_bytes(metadata), [
        _meta(payer, True, True), _meta(authority, True), _meta(pool, writable=True),
        _meta(associated_token_address(pool, collateral_mint), writable=True),
        _meta(collateral_mint), _meta(ASSOCIATED_TOKEN_PROGRAM_ID), _meta(TOKEN_PROGRAM_ID),
        _meta(SYSTEM_PROGRAM_ID)])


def pool_extract(authority: Pubkey, index: int, collateral_mint: Pubkey, amount: int) -> Instruction:
    pool = pool_address(index)
    return _ix(1, struct.pack("<Q", amount), [
        _meta(authority, True), _meta(associated_token_address(authority, collateral_mint), writable=True),
        _meta(pool, writable=True),
        _meta(associated_token_address(pool, collateral_mint), writable=True),
        _meta(TOKEN_PROGRAM_ID)])


def _option(value: bytes | None) -> bytes:
    return b"\0" if value is None else b"\1" + value


def pool_update(authority: Pubkey, index: int, max_deposit: int | None = None,
                freeze: bool | None = None, metadata: bytes | None = None) -> Instruction:
    """Change what is given; None leaves a field as it is."""
    params = (_option(None if max_deposit is None else struct.pack("<Q", max_deposit))
              + _option(None if freeze is None else bytes([freeze]))
              + _option(None if metadata is None else metadata_bytes(metadata)))
    return _ix(2, params, [_meta(authority, True), _meta(pool_address(index), writable=True)])


def pool_claimable(authority: Pubkey, index: int, redeemable_mint: Pubkey) -> Instruction:
    """Enable claims of `redeemable_mint` (paid from the pool's vault of that mint)."""
    return _ix(3, b"", [_meta(authority, True), _meta(pool_address(index), writable=True),
                        _meta(redeemable_mint)])


def lender_create(payer: Pubkey, user: Pubkey, index: int) -> Instruction:
    pool = pool_address(index)
    return _ix(4, b"", [_meta(payer, True, True), _meta(user, True), _meta(pool),
                        _meta(lender_address(pool, user), writable=True), _meta(SYSTEM_PROGRAM_ID)])


def lender_deposit(user: Pubkey, index: int, collateral_mint: Pubkey, amount: int) -> Instruction:
    pool = pool_address(index)
    return _ix(5, struct.pack("<Q", amount), [
        _meta(user, True), _meta(associated_token_address(user, collateral_mint), writable=True),
        _meta(pool, writable=True),
        _meta(associated_token_address(pool, collateral_mint), writable=True),
        _meta(lender_address(pool, user), writable=True), _meta(TOKEN_PROGRAM_ID)])


def lender_claim(user: Pubkey, index: int, redeemable_mint: Pubkey, amount: int) -> Instruction:
    pool = pool_address(index)
    return _ix(6, struct.pack("<Q", amount), [
        _meta(user, True), _meta(associated_token_address(user, redeemable_mint), writable=True),
        _meta(pool, writable=True),
        _meta(associated_token_address(pool, redeemable_mint), writable=True),
        _meta(redeemable_mint), _meta(lender_address(pool, user), writable=True),
        _meta(TOKEN_PROGRAM_ID)])


@dataclass(frozen=True)
class Pool:
    bump: int
    index: int
    authority: Pubkey
    collateral_mint: Pubkey
    max_deposit_collateral_amount: int
    total_deposited_collateral_amount: int
    total_extracted_collateral_amount: int
    claiming_enabled: bool
    redeemable_mint: Pubkey
    total_claimed_redeemable_amount: int
    freeze: bool
    metadata: bytes

    def to_json(self) -> dict[str, object]:
        return {
            "index": self.index, "authority": str(self.authority),
            "collateral_mint": str(self.collateral_mint),
            "max_deposit_collateral_amount": self.max_deposit_collateral_amount,
            "total_deposited_collateral_amount": self.total_deposited_collateral_amount,
            "total_extracted_collateral_amount": self.total_extracted_collateral_amount,
            "claiming_enabled": self.claiming_enabled,
            "redeemable_mint": str(self.redeemable_mint) if self.claiming_enabled else None,
            "total_claimed_redeemable_amount": self.total_claimed_redeemable_amount,
            "freeze": self.freeze, "metadata": self.metadata.decode(errors="replace")}


@dataclass(frozen=True)
class Lender:
    bump: int
    deposited_collateral_amount: int
    claimed_redeemable_amount: int


def decode_pool(data: bytes) -> Pool:
    if len(data) != POOL_SPACE or data[:8] != POOL_DISCRIMINATOR:
        raise ValueError("not a mining pool account")
    (_, bump, index, authority, mint, max_deposit, deposited, extracted, claiming, redeemable,
     claimed, freeze, length, metadata) = _POOL.unpack_from(data)
    return Pool(bump, index, Pubkey(authority), Pubkey(mint), max_deposit, deposited, extracted,
                claiming, Pubkey(redeemable), claimed, freeze, metadata[:min(length, METADATA_MAX)])


def decode_lender(data: bytes) -> Lender:
    if len(data) != LENDER_SPACE or data[:8] != LENDER_DISCRIMINATOR:
        raise ValueError("not a mining pool lender account")
    _, bump, deposited, claimed = _LENDER.unpack_from(data)
    return Lender(bump, deposited, claimed)


def lender_share(pool: Pool, lender: Lender, vault_amount: int) -> int:
    """What the lender may have claimed in all (claimed so far included), as on chain."""
    if pool.total_deposited_collateral_amount == 0:
        return 0
    repaid = min(pool.total_claimed_redeemable_amount + vault_amount, 2**64 - 1)
    return repaid * lender.deposited_collateral_amount // pool.total_deposited_collateral_amount


def claimable_now(pool: Pool, lender: Lender, vault_amount: int) -> int:
    """What the lender can claim now (0 before claims are enabled)."""
    if not pool.claiming_enabled or pool.freeze:
        return 0
    return max(0, lender_share(pool, lender, vault_amount) - lender.claimed_redeemable_amount)
