"""The mining pool program (programs/mining_pool.c): the whole flow through the local
validator's JSON-RPC server, and every instruction sent by someone it must refuse (a
non-authority, a lender claiming twice or someone else's share, a deposit past the max or
into a frozen pool, forged accounts), each refused with its NAMED program error and no
account of the pool or token programs changed.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from solders.instruction import Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from psyche_solana import instructions as ix
from psyche_solana import mining_pool as mp
from psyche_solana.ids import TOKEN_PROGRAM_ID, mining_pool_program
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import ProgramError, SolanaRpc
from psyche_solana.svm import ProgramSvm, TransactionFailed
from tests.solana.refusals import unsigned, with_account

pytestmark = pytest.mark.timeout(120)


def test_account_layouts_are_psyches() -> None:
    """Anchor's account sizes and discriminators, the same in the program and here."""
    pool, lender = hashlib.sha256(b"account:Pool"), hashlib.sha256(b"account:Lender")
    assert pool.digest()[:8] == mp.POOL_DISCRIMINATOR
    assert lender.digest()[:8] == mp.LENDER_DISCRIMINATOR
    assert (mp.POOL_SPACE, mp.LENDER_SPACE) == (560, 32)
    # the program's copies of the discriminators
    text = (Path(mp.__file__).parent / "programs" / "mining_pool.c").read_text()
    for digest in (pool, lender):
        assert ", ".join(str(b) for b in digest.digest()[:8]) in text


# ---------------------------------------------------------------- the flow over JSON-RPC
async def _flow(url: str) -> None:
    async with SolanaRpc([url]) as rpc:
        authority, lenders = Keypair(), [Keypair() for _ in range(3)]
        for key in (authority, *lenders):
            await rpc.airdrop(key.pubkey(), 10**10)
        collateral, reward = Keypair(), Keypair()
        rent = await rpc.minimum_balance(ix.MINT_SIZE)
        for mint in (collateral, reward):
            await rpc.send_instructions(ix.create_mint(
                authority.pubkey(), mint.pubkey(), rent, 6, authority.pubkey()), authority, [mint])
        c, r, me = collateral.pubkey(), reward.pubkey(), authority.pubkey()
        index = 7
        pool = mp.pool_address(index)
        await rpc.send_instructions([
            mp.pool_create(me, me, index, c, b'{"run": "flow"}'),
            mp.pool_update(me, index, max_deposit=1000),
            ix.create_associated_token_account(me, me, c)], authority)
        deposits = [100, 200, 301]
        for lender, amount in zip(lenders, deposits, strict=True):
            user = lender.pubkey()
            await rpc.send_instructions([
                ix.create_associated_token_account(me, user, c),
                ix.mint_to(c, ix.associated_token_address(user, c), me, amount)], authority)
            await rpc.send_instructions([mp.lender_create(user, user, index),
                                         mp.lender_deposit(user, index, c, amount)], lender)
        state = mp.decode_pool(await rpc.account_data(pool) or b"")
        assert state.total_deposited_collateral_amount == 601
        assert state.metadata == b'{"run": "flow"}' and state.authority == me

        await rpc.send_instructions([mp.pool_extract(me, index, c, 601)], authority)
        mine = await rpc.account_data(ix.associated_token_address(me, c))
        assert mine is not None and ix.token_amount(mine) == 601

        vault = ix.associated_token_address(pool, r)
        await rpc.send_instructions([
            ix.create_associated_token_account(me, pool, r),
            ix.create_associated_token_account(me, me, r),
            ix.mint_to(r, ix.associated_token_address(me, r), me, 1000),
            ix.token_transfer_checked(ix.associated_token_address(me, r), r, vault, me, 1000, 6),
            mp.pool_claimable(me, index, r)], authority)

        paid = []
        for lender, amount in zip(lenders, deposits, strict=True):
            user = lender.pubkey()
            pool_now = mp.decode_pool(await rpc.account_data(pool) or b"")
            held = ix.token_amount(await rpc.account_data(vault) or b"")
            record = mp.decode_lender(await rpc.account_data(mp.lender_address(pool, user)) or b"")
            share = mp.claimable_now(pool_now, record, held)
            assert share == 1000 * amount // 601  # the proportion, rounded down
            await rpc.send_instructions([ix.create_associated_token_account(user, user, r),
                                         mp.lender_claim(user, index, r, share)], lender)
            paid.append(ix.token_amount(
                await rpc.account_data(ix.associated_token_address(user, r)) or b""))
            with pytest.raises(ProgramError) as again:  # no second claim
                await rpc.send_instructions([mp.lender_claim(user, index, r, 1)], lender)
            assert again.value.code is not None
            assert mp.error_name(again.value.code) == "ParamsRedeemableAmountIsTooLarge"
        assert paid == [166, 332, 500]
        left = ix.token_amount(await rpc.account_data(vault) or b"")
        assert sum(paid) + left == 1000 and sum(paid) <= 1000
        final = mp.decode_pool(await rpc.account_data(pool) or b"")
        assert final.total_claimed_redeemable_amount == sum(paid) and final.claiming_enabled


def test_create_deposit_extract_reward_and_claim_in_proportion_over_json_rpc() -> None:
    with Localnet() as net:
        asyncio.run(_flow(net.url))


# ---------------------------------------------------------------- the attack table
@dataclass
class World:
    svm: ProgramSvm
    authority: Keypair
    a: Keypair          # deposited 100 in pool 1, claimed its whole share
    b: Keypair          # deposited 200 in pool 1, claimed nothing
    c: Keypair          # a lender of pool 1 with collateral, deposited nothing
    intruder: Keypair   # holds token accounts of both mints, in no pool
    collateral: Pubkey
    reward: Pubkey
    # pool 1: max 1000, 300 deposited, claims enabled with 900 rewards;
    # pool 2: frozen, `a` a lender; pool 3: 50 deposited by `a`, claims not enabled


def _mint(svm: ProgramSvm, authority: Keypair) -> Pubkey:
    mint = Keypair()
    rent = svm.svm.minimum_balance_for_rent_exemption(ix.MINT_SIZE)
    svm.send(ix.create_mint(authority.pubkey(), mint.pubkey(), rent, 0, authority.pubkey()),
             [authority, mint])
    return mint.pubkey()


def _fund(svm: ProgramSvm, authority: Keypair, user: Pubkey, mint: Pubkey, amount: int) -> None:
    me = authority.pubkey()
    svm.send([ix.create_associated_token_account(me, user, mint),
              ix.mint_to(mint, ix.associated_token_address(user, mint), me, amount)], [authority])


@pytest.fixture(scope="module")
def world() -> World:
    svm = ProgramSvm()
    authority, a, b, c, intruder = (Keypair() for _ in range(5))
    for key in (authority, a, b, c, intruder):
        svm.airdrop(key.pubkey(), 10**10)
    collateral, reward = _mint(svm, authority), _mint(svm, authority)
    me = authority.pubkey()
    for holder in (me, a.pubkey(), b.pubkey(), c.pubkey(), intruder.pubkey()):
        _fund(svm, authority, holder, collateral, 1000)
        _fund(svm, authority, holder, reward, 1000)
    for index in (1, 2, 3):
        svm.send([mp.pool_create(me, me, index, collateral, b"pool"),
                  mp.pool_update(me, index, max_deposit=1000)], [authority])
    for user, number, amount in ((a, 1, 100), (b, 1, 200), (c, 1, 0), (a, 2, 0), (a, 3, 50)):
        svm.send([mp.lender_create(user.pubkey(), user.pubkey(), number)]
                 + ([mp.lender_deposit(user.pubkey(), number, collateral, amount)] if amount else []),
                 [user])
    svm.send([mp.pool_update(me, 2, freeze=True)], [authority])
    pool = mp.pool_address(1)
    svm.send([ix.create_associated_token_account(me, pool, reward),
              ix.token_transfer_checked(ix.associated_token_address(me, reward), reward,
                                        ix.associated_token_address(pool, reward), me, 900, 0),
              mp.pool_claimable(me, 1, reward)], [authority])
    svm.send([mp.lender_claim(a.pubkey(), 1, reward, 300)], [a])  # 900 * 100 / 300
    return World(svm, authority, a, b, c, intruder, collateral, reward)


def _snapshot(svm: ProgramSvm) -> dict[Pubkey, tuple[Pubkey, int, bytes]]:
    return {address: (account.owner, account.lamports, bytes(account.data))
            for program in (mining_pool_program(), TOKEN_PROGRAM_ID)
            for address, account in svm.svm.get_program_accounts(program)}


def _with_data(instruction: Instruction, data: bytes) -> Instruction:
    return Instruction(instruction.program_id, data, list(instruction.accounts))


Case = Callable[[World], tuple[Instruction, Keypair]]


def _key(w: World, who: str) -> Pubkey:
    keypair: Keypair = getattr(w, who)
    return keypair.pubkey()


CASES: list[tuple[str, str, Case]] = [
    # the authority's instructions, by anyone else
    ("update-by-intruder", "NotPoolAuthority",
     lambda w: (mp.pool_update(_key(w, "intruder"), 1, max_deposit=10**12), w.intruder)),
    ("unfreeze-by-intruder", "NotPoolAuthority",
     lambda w: (mp.pool_update(_key(w, "intruder"), 2, freeze=False), w.intruder)),
    ("extract-by-intruder", "NotPoolAuthority",
     lambda w: (mp.pool_extract(_key(w, "intruder"), 1, w.collateral, 300), w.intruder)),
    ("extract-by-a-lender", "NotPoolAuthority",
     lambda w: (mp.pool_extract(_key(w, "b"), 1, w.collateral, 200), w.b)),
    ("claimable-by-intruder", "NotPoolAuthority",
     lambda w: (mp.pool_claimable(_key(w, "intruder"), 3, w.reward), w.intruder)),
    ("authority-listed-not-signing", "MissingSignature", lambda w: (unsigned(
        mp.pool_extract(_key(w, "authority"), 1, w.collateral, 300), _key(w, "authority")), w.svm.payer)),
    ("extract-to-someone-elses-account", "WrongTokenAccount", lambda w: (with_account(
        mp.pool_extract(_key(w, "authority"), 1, w.collateral, 300), 1,
        ix.associated_token_address(_key(w, "intruder"), w.collateral)), w.authority)),
    ("extract-from-a-forged-vault", "WrongPoolVault", lambda w: (with_account(
        mp.pool_extract(_key(w, "authority"), 1, w.collateral, 300), 3,
        ix.associated_token_address(_key(w, "intruder"), w.collateral)), w.authority)),
    ("extract-while-frozen", "PoolFreezeIsTrue",
     lambda w: (mp.pool_extract(_key(w, "authority"), 2, w.collateral, 0), w.authority)),
    ("claimable-twice", "PoolClaimingEnabledIsTrue",
     lambda w: (mp.pool_claimable(_key(w, "authority"), 1, w.reward), w.authority)),
    ("claimable-while-frozen", "PoolFreezeIsTrue",
     lambda w: (mp.pool_claimable(_key(w, "authority"), 2, w.reward), w.authority)),
    # lenders
    ("claim-twice", "ParamsRedeemableAmountIsTooLarge",
     lambda w: (mp.lender_claim(_key(w, "a"), 1, w.reward, 1), w.a)),
    ("claim-more-than-the-share", "ParamsRedeemableAmountIsTooLarge",
     lambda w: (mp.lender_claim(_key(w, "b"), 1, w.reward, 601), w.b)),
    ("claim-with-no-deposit", "ParamsRedeemableAmountIsTooLarge",
     lambda w: (mp.lender_claim(_key(w, "c"), 1, w.reward, 1), w.c)),
    ("claim-another-lenders-share", "WrongLender", lambda w: (with_account(
        mp.lender_claim(_key(w, "intruder"), 1, w.reward, 600), 5,
        mp.lender_address(mp.pool_address(1), _key(w, "b"))), w.intruder)),
    ("claim-into-another-lenders-account", "WrongTokenAccount", lambda w: (with_account(
        mp.lender_claim(_key(w, "b"), 1, w.reward, 600), 1,
        ix.associated_token_address(_key(w, "intruder"), w.reward)), w.b)),
    ("claim-from-a-forged-vault", "WrongPoolVault", lambda w: (with_account(
        mp.lender_claim(_key(w, "b"), 1, w.reward, 600), 3,
        ix.associated_token_address(_key(w, "intruder"), w.reward)), w.b)),
    ("claim-another-mint", "WrongRedeemableMint",
     lambda w: (mp.lender_claim(_key(w, "b"), 1, w.collateral, 1), w.b)),
    ("claim-before-claims-are-enabled", "PoolClaimingEnabledIsFalse", lambda w: (
        mp.lender_claim(_key(w, "a"), 3, w.reward, 1), w.a)),
    ("claim-unsigned", "MissingSignature", lambda w: (unsigned(
        mp.lender_claim(_key(w, "b"), 1, w.reward, 600), _key(w, "b")), w.svm.payer)),
    ("deposit-past-the-max", "ParamsCollateralAmountIsTooLarge",
     lambda w: (mp.lender_deposit(_key(w, "a"), 3, w.collateral, 951), w.a)),
    ("deposit-overflowing-the-total", "ParamsCollateralAmountIsTooLarge",
     lambda w: (mp.lender_deposit(_key(w, "a"), 3, w.collateral, 2**64 - 1), w.a)),
    ("deposit-once-claims-are-enabled", "PoolClaimingEnabledIsTrue",
     lambda w: (mp.lender_deposit(_key(w, "c"), 1, w.collateral, 1), w.c)),
    ("deposit-into-a-frozen-pool", "PoolFreezeIsTrue",
     lambda w: (mp.lender_deposit(_key(w, "a"), 2, w.collateral, 1), w.a)),
    ("deposit-from-another-lenders-tokens", "WrongTokenAccount", lambda w: (with_account(
        mp.lender_deposit(_key(w, "c"), 1, w.collateral, 10), 1,
        ix.associated_token_address(_key(w, "b"), w.collateral)), w.c)),
    ("deposit-credited-to-another-lender", "WrongLender", lambda w: (with_account(
        mp.lender_deposit(_key(w, "c"), 1, w.collateral, 10), 4,
        mp.lender_address(mp.pool_address(1), _key(w, "b"))), w.c)),
    ("deposit-without-a-lender-account", "WrongLender",
     lambda w: (mp.lender_deposit(_key(w, "intruder"), 1, w.collateral, 10), w.intruder)),
    ("lender-create-for-someone-else", "WrongLender", lambda w: (with_account(
        mp.lender_create(_key(w, "intruder"), _key(w, "intruder"), 1), 3,
        mp.lender_address(mp.pool_address(1), _key(w, "b"))), w.intruder)),
    ("lender-create-twice", "AlreadyInitialized",
     lambda w: (mp.lender_create(_key(w, "b"), _key(w, "b"), 1), w.b)),
    # pools
    ("pool-create-twice", "AlreadyInitialized", lambda w: (mp.pool_create(
        _key(w, "intruder"), _key(w, "intruder"), 1, w.collateral), w.intruder)),
    ("pool-create-at-another-address", "WrongPoolAddress", lambda w: (with_account(
        mp.pool_create(_key(w, "intruder"), _key(w, "intruder"), 9, w.collateral), 2,
        mp.pool_address(10)), w.intruder)),
    ("pool-metadata-too-long", "ParamsMetadataLengthIsTooLarge", lambda w: (_with_data(
        mp.pool_create(_key(w, "intruder"), _key(w, "intruder"), 9, w.collateral),
        b"\0" + (9).to_bytes(8, "little") + (401).to_bytes(2, "little") + bytes(400)), w.intruder)),
    ("update-metadata-too-long", "ParamsMetadataLengthIsTooLarge", lambda w: (_with_data(
        mp.pool_update(_key(w, "authority"), 1), b"\2\0\0\1" + (401).to_bytes(2, "little")
        + bytes(400)), w.authority)),
    ("update-truncated", "InvalidInstruction", lambda w: (_with_data(
        mp.pool_update(_key(w, "authority"), 1), b"\2\1\0\0"), w.authority)),
    ("update-a-lender-account-as-pool", "WrongAccountSize", lambda w: (with_account(
        mp.pool_update(_key(w, "authority"), 1, freeze=True), 1,
        mp.lender_address(mp.pool_address(1), _key(w, "b"))), w.authority)),
    ("unknown-instruction", "InvalidInstruction", lambda w: (_with_data(
        mp.pool_update(_key(w, "authority"), 1), b"\x07"), w.authority)),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=n) for n, _, c in CASES])
def test_refused_with_its_named_error_and_no_account_changes(world: World, case: Case) -> None:
    expected = next(e for _, e, c in CASES if c is case)
    instruction, signer = case(world)
    before = _snapshot(world.svm)
    with pytest.raises(TransactionFailed) as failure:
        world.svm.send([instruction], [signer])
    assert failure.value.code is not None, failure.value
    assert mp.error_name(failure.value.code) == expected, failure.value.logs[-4:]
    assert _snapshot(world.svm) == before


def test_the_honest_claim_still_works_after_the_attacks(world: World) -> None:
    """b's share is 900 * 200 / 300 = 600 whatever was tried before; then the vault is empty."""
    pool = mp.pool_address(1)
    vault = ix.associated_token_address(pool, world.reward)
    world.svm.send([mp.lender_claim(world.b.pubkey(), 1, world.reward, 600)], [world.b])
    assert ix.token_amount(world.svm.data(vault)) == 0
    state = mp.decode_pool(world.svm.data(pool))
    assert state.total_claimed_redeemable_amount == 900
    assert mp.decode_lender(world.svm.data(mp.lender_address(pool, world.b.pubkey()))) \
        .claimed_redeemable_amount == 600


def test_every_instruction_stays_under_a_tenth_of_the_compute_limit() -> None:
    """The figures bench/solana.py prints as cu_pool_*."""
    from bench.solana import CU_LIMIT, pool_compute_units

    figures = pool_compute_units()
    assert set(figures) == {"cu_pool_create", "cu_pool_update", "cu_pool_extract",
                            "cu_pool_claimable", "cu_pool_lender_create",
                            "cu_pool_lender_deposit", "cu_pool_lender_claim"}
    assert all(0 < units <= CU_LIMIT // 10 for units in figures.values()), figures


def test_shares_of_amounts_near_the_u64_limit_are_exact_and_sum_within_the_vault() -> None:
    """The share's product needs 128 bits (the program divides by shift-and-subtract)."""
    svm = ProgramSvm()
    authority, lenders = Keypair(), [Keypair(), Keypair()]
    for key in (authority, *lenders):
        svm.airdrop(key.pubkey(), 10**10)
    collateral, reward = _mint(svm, authority), _mint(svm, authority)
    me, deposits, rewards = authority.pubkey(), [7 * 10**18 + 3, 3 * 10**18 - 1], 2**64 - 7
    for key, amount in zip(lenders, deposits, strict=True):
        _fund(svm, authority, key.pubkey(), collateral, amount)
    _fund(svm, authority, me, reward, rewards)
    svm.send([mp.pool_create(me, me, 1, collateral), mp.pool_update(me, 1, max_deposit=2**64 - 1)],
             [authority])
    for key, amount in zip(lenders, deposits, strict=True):
        svm.send([mp.lender_create(key.pubkey(), key.pubkey(), 1),
                  mp.lender_deposit(key.pubkey(), 1, collateral, amount)], [key])
    pool = mp.pool_address(1)
    svm.send([ix.create_associated_token_account(me, pool, reward),
              ix.token_transfer_checked(ix.associated_token_address(me, reward), reward,
                                        ix.associated_token_address(pool, reward), me, rewards, 0),
              mp.pool_claimable(me, 1, reward)], [authority])
    shares = [rewards * amount // sum(deposits) for amount in deposits]
    for key, share in zip(lenders, shares, strict=True):
        svm.send([ix.create_associated_token_account(key.pubkey(), key.pubkey(), reward)], [key])
        with pytest.raises(TransactionFailed) as failure:  # one unit more than the share
            svm.send([mp.lender_claim(key.pubkey(), 1, reward, share + 1)], [key])
        assert mp.error_name(failure.value.code or 0) == "ParamsRedeemableAmountIsTooLarge"
        svm.send([mp.lender_claim(key.pubkey(), 1, reward, share)], [key])
    left = ix.token_amount(svm.data(ix.associated_token_address(pool, reward)))
    assert sum(shares) + left == rewards and left >= 0
