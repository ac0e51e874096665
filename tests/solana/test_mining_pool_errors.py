"""The mining pool's error codes are in the shared table (psyche_solana.errors), so a
refusal of the mining pool program is named wherever it is reported (issue 37): the
table matches the C program's enum, and a real refusal through the local validator's
JSON-RPC reads "mining_pool program error 6005: PoolFreezeIsTrue: ..." (it was
"UnknownError6005")."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from solders.keypair import Keypair

from psyche_solana import errors
from psyche_solana import instructions as ix
from psyche_solana import mining_pool as mp
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import ProgramError, SolanaRpc

pytestmark = pytest.mark.timeout(60)


def c_pool_errors() -> dict[int, str]:
    """enum PoolError of programs/mining_pool.c, numbered as C numbers an enum."""
    source = (Path(mp.__file__).parent / "programs" / "mining_pool.c").read_text()
    body = re.search(r"enum PoolError \{(.*?)\};", source, re.S)
    assert body is not None, "mining_pool.c has no enum PoolError"
    table, code = {}, -1
    for entry in (e.strip() for e in body.group(1).split(",")):
        if not entry:
            continue
        name, _, value = (part.strip() for part in entry.partition("="))
        code = int(value) if value else code + 1
        table[code] = name.removeprefix("E_")
    return table


def test_the_shared_table_names_every_error_of_the_mining_pool_program() -> None:
    in_c = c_pool_errors()
    assert len(in_c) == 13
    assert in_c == errors.MINING_POOL_ERRORS
    for code, name in in_c.items():
        assert errors.PROGRAM_ERRORS[code] == name
        assert errors.describe(code).startswith(f"{name}: ")  # each says what to do
    # no mining pool code shadows another program's
    others = {code for code in errors.PROGRAM_ERRORS if code not in in_c}
    assert others and min(in_c) > max(others)


async def refused_deposit_into_a_frozen_pool(url: str) -> ProgramError:
    async with SolanaRpc([url]) as rpc:
        authority, lender, collateral = Keypair(), Keypair(), Keypair()
        for key in (authority, lender):
            await rpc.airdrop(key.pubkey(), 10**10)
        me, user, mint = authority.pubkey(), lender.pubkey(), collateral.pubkey()
        rent = await rpc.minimum_balance(ix.MINT_SIZE)
        await rpc.send_instructions(ix.create_mint(me, mint, rent, 6, me), authority, [collateral])
        index = 11
        await rpc.send_instructions([
            mp.pool_create(me, me, index, mint), mp.pool_update(me, index, max_deposit=1000),
            ix.create_associated_token_account(me, user, mint),
            ix.mint_to(mint, ix.associated_token_address(user, mint), me, 10)], authority)
        await rpc.send_instructions([mp.lender_create(user, user, index),
                                     mp.lender_deposit(user, index, mint, 4)], lender)
        await rpc.send_instructions([mp.pool_update(me, index, freeze=True)], authority)
        with pytest.raises(ProgramError) as refused:
            await rpc.send_instructions([mp.lender_deposit(user, index, mint, 1)], lender)
        held = await rpc.account_data(ix.associated_token_address(user, mint))
        assert held is not None and ix.token_amount(held) == 6  # the refused 1 stayed
        return refused.value


def test_a_real_mining_pool_refusal_is_named_from_the_shared_table() -> None:
    with Localnet() as net:
        error = asyncio.run(refused_deposit_into_a_frozen_pool(net.url))
    assert error.code == 6005 and error.name == "PoolFreezeIsTrue"
    first_line = str(error).splitlines()[0]
    assert ("mining_pool program error 6005: PoolFreezeIsTrue: the pool is frozen "
            "(its authority unfreezes it with pool-update --unfreeze)") in first_line
