"""The Pools & airdrops panel (issue 37): the mining pools this wallet lent to and its
allocations in the airdrop of AIRDROP_PROOFS, with their figures, and a claim behind a
confirmation that shows the exact amount the transaction then sends.

Our mining pool and distributor programs in LiteSVM behind the JSON-RPC server on
loopback (psyche_solana.localnet); pools, lenders and the airdrop made by real
transactions; the real `WalletFunds` reads and claims; the TUI driven by Pilot.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from test_rm_tui import text_of
from textual.pilot import Pilot
from textual.widgets import DataTable

from psyche_solana import distributor as dist
from psyche_solana import instructions as ix
from psyche_solana import mining_pool as mp
from psyche_solana.localnet import Localnet
from psyche_solana.merkle import Allocation, Vesting
from psyche_solana.rpc import SolanaRpc
from run_manager.commands.airdrop import proofs_json
from run_manager.funds import WalletFunds
from run_manager.tui.app import RunManagerApp
from run_manager.tui.widgets.funds_claim_screen import FundsClaimScreen
from run_manager.tui.widgets.funds_panel import FundsPanel
from run_manager.view import Dashboard
from tests.run_manager.tui_setup import claim_dialog_on_row, funds_app, token_balance

pytestmark = pytest.mark.timeout(180)

WALLET = Keypair.from_seed(bytes([37]) * 32)
AUTHORITY = Keypair.from_seed(bytes([38]) * 32)
OTHER = Keypair.from_seed(bytes([39]) * 32)
# Fixed mints, so that the snapshot's short mint names do not change.
COLLATERAL, REWARD, DROPPED = (Keypair.from_seed(bytes([n]) * 32) for n in (40, 41, 42))
M = 10**6  # the mints have 6 decimals
POOL_PAID, POOL_WAITING, POOL_NOT_MINE = 3, 4, 5
AIRDROP_ID = 9
SHARE = 1000 * M * 100 // 300  # 100 of the 300 deposited, of 1000 reward tokens: 333.333333


@dataclass
class World:
    net: Localnet
    proofs: Path


async def _mint_to(rpc: SolanaRpc, mint: Pubkey, owner: Pubkey, amount: int) -> None:
    me = AUTHORITY.pubkey()
    await rpc.send_instructions([ix.create_associated_token_account(me, owner, mint),
                                 ix.mint_to(mint, ix.associated_token_address(owner, mint), me,
                                            amount)], AUTHORITY)


async def _lend(rpc: SolanaRpc, lender: Keypair, index: int, amount: int) -> None:
    user = lender.pubkey()
    await _mint_to(rpc, COLLATERAL.pubkey(), user, amount)
    await rpc.send_instructions([mp.lender_create(user, user, index),
                                 mp.lender_deposit(user, index, COLLATERAL.pubkey(), amount)],
                                lender)


async def _build(url: str, proofs: Path) -> None:
    """Pool 3: WALLET lent 100 of 300, the collateral extracted, 1000 reward tokens
    deposited, claims enabled. Pool 4: WALLET lent 50, no claims yet. Pool 5: another
    lender only. Airdrop 9: WALLET has 5 tokens vested (1 claimed) and 3 not vesting yet."""
    async with SolanaRpc([url]) as rpc:
        for key in (AUTHORITY, WALLET, OTHER):
            await rpc.airdrop(key.pubkey(), 10**10)
        me, c, r = AUTHORITY.pubkey(), COLLATERAL.pubkey(), REWARD.pubkey()
        rent = await rpc.minimum_balance(ix.MINT_SIZE)
        for mint in (COLLATERAL, REWARD, DROPPED):
            await rpc.send_instructions(ix.create_mint(me, mint.pubkey(), rent, 6, me),
                                        AUTHORITY, [mint])
        for index in (POOL_PAID, POOL_WAITING, POOL_NOT_MINE):
            await rpc.send_instructions([mp.pool_create(me, me, index, c),
                                         mp.pool_update(me, index, max_deposit=10**6 * M)],
                                        AUTHORITY)
        await _lend(rpc, WALLET, POOL_PAID, 100 * M)
        await _lend(rpc, OTHER, POOL_PAID, 200 * M)
        await _lend(rpc, WALLET, POOL_WAITING, 50 * M)
        await _lend(rpc, OTHER, POOL_NOT_MINE, 10 * M)
        await rpc.send_instructions([ix.create_associated_token_account(me, me, c),
                                     mp.pool_extract(me, POOL_PAID, c, 300 * M)], AUTHORITY)
        pool = mp.pool_address(POOL_PAID)
        await rpc.send_instructions([ix.create_associated_token_account(me, pool, r),
                                     ix.mint_to(r, ix.associated_token_address(pool, r), me,
                                                1000 * M),
                                     mp.pool_claimable(me, POOL_PAID, r)], AUTHORITY)

        now = int(time.time())
        allocations = [
            Allocation(bytes(WALLET.pubkey()), 0, Vesting(now - 1000, 0, 5 * M)),
            Allocation(bytes(WALLET.pubkey()), 1, Vesting(now + 10**7, 60, 3 * M)),
            Allocation(bytes(OTHER.pubkey()), 0, Vesting(now - 1000, 0, 7 * M))]
        written = proofs_json(AIRDROP_ID, DROPPED.pubkey(), 6, allocations)
        await _mint_to(rpc, DROPPED.pubkey(), me, 15 * M)
        await dist.create_and_fund(rpc, AUTHORITY, AIRDROP_ID, DROPPED.pubkey(),
                                   bytes.fromhex(written["merkle_root"]), 15 * M, 6)
        proofs.write_text(json.dumps(written))
        # Elsewhere (airdrop-claim): 1 of the 5 vested tokens claimed already.
        from run_manager.funds import read_proofs_file

        _, lines = read_proofs_file(proofs)
        await dist.redeem(rpc, WALLET, AIRDROP_ID, lines[0], 1 * M)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with Localnet() as net:
        proofs = tmp_path / "airdrop-9-proofs.json"
        asyncio.run(_build(net.url, proofs))
        yield World(net, proofs)


async def listed(app: RunManagerApp, pilot: Pilot[None], rows: int) -> FundsPanel:
    """The panel once it has read the chain (its first read starts on mount)."""
    panel = app.query_one(FundsPanel)
    deadline = time.monotonic() + 30
    while panel.status is None or len(panel.rows) < rows:
        assert time.monotonic() < deadline, (panel.error, text_of(app, "#funds-notes"))
        await pilot.pause(0.1)
    await pilot.pause()
    return panel


def cells(app: RunManagerApp, key: str) -> list[str]:
    return [str(cell) for cell in app.query_one("#funds-table", DataTable).get_row(key)]


async def test_the_panel_lists_the_wallets_pools_and_airdrop_with_their_figures(
        world: World) -> None:
    app = funds_app(world.net.url, WALLET, world.proofs)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            panel = await listed(app, pilot, 4)
            assert panel.display and panel.error == ""
            assert [stake.key for stake in panel.rows] == [
                "pool:3", "pool:4", "airdrop:9:0", "airdrop:9:1"]  # not pool 5: not a lender
            assert cells(app, "pool:3")[:5] == [
                "pool 3", "deposited 100 (33.3% of 300)", "share 333.333333", "claimed 0",
                "claimable 333.333333"]
            assert cells(app, "pool:4")[1:] == [
                "deposited 50 (100% of 50)", "share 0", "claimed 0", "claimable 0",
                "claims not enabled"]
            assert cells(app, "airdrop:9:0")[:5] == [
                "airdrop 9 #0", "allocated 5", "vested 5", "claimed 1", "claimable 4"]
            assert cells(app, "airdrop:9:1")[1:] == [
                "allocated 3", "vested 0", "claimed 0", "claimable 0", "nothing vested yet"]
            assert "no proofs file" not in text_of(app, "#funds-notes")
            assert app.check_action("claim_funds", ()) is True
    finally:
        await app.funds.close()  # type: ignore[union-attr]  # given above


async def test_a_confirmed_claim_sends_exactly_the_amount_the_dialog_shows(world: World) -> None:
    app = funds_app(world.net.url, WALLET, world.proofs)
    reward_before = await token_balance(world.net.url, WALLET.pubkey(), REWARD.pubkey())
    dropped_before = await token_balance(world.net.url, WALLET.pubkey(), DROPPED.pubkey())
    assert (reward_before, dropped_before) == (0, 1 * M)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await listed(app, pilot, 4)
            await pilot.press("a")  # the highlighted row: pool 3
            await pilot.pause()
            dialog = app.screen
            assert isinstance(dialog, FundsClaimScreen) and dialog.amount == SHARE
            assert dialog.question.startswith(
                f"Claim {SHARE} base units = 333.333333 tokens ({REWARD.pubkey()})\n"
                "from mining pool 3 (this wallet's share of its rewards)\n"
                f"to wallet {WALLET.pubkey()}?")
            await pilot.click("#claim-confirm")
            await app.workers.wait_for_complete()
            await pilot.pause()
            reward = await token_balance(world.net.url, WALLET.pubkey(), REWARD.pubkey())
            assert reward == reward_before + SHARE
            assert text_of(app, "#funds-notes").splitlines()[-1] == (
                f"claimed {SHARE} base units from pool 3: token balance now {SHARE} base units")
            assert cells(app, "pool:3")[3:5] == ["claimed 333.333333", "claimable 0"]

            # The airdrop's vested, unclaimed 4 tokens: enter on its row.
            dialog = await claim_dialog_on_row(app, pilot, 2)
            assert dialog.amount == 4 * M
            assert dialog.question.startswith(
                f"Claim {4 * M} base units = 4 tokens ({DROPPED.pubkey()})\n"
                "from airdrop 9, allocation #0 (vested so far)")
            await pilot.press("y")
            await app.workers.wait_for_complete()
            await pilot.pause()
            dropped = await token_balance(world.net.url, WALLET.pubkey(), DROPPED.pubkey())
            assert dropped == dropped_before + 4 * M
            assert cells(app, "airdrop:9:0")[3:5] == ["claimed 5", "claimable 0"]

            # Nothing left there: a notification, no dialog, no transaction.
            await pilot.press("enter")
            await pilot.pause()
            assert not isinstance(app.screen, FundsClaimScreen)
    finally:
        await app.funds.close()  # type: ignore[union-attr]  # given above
    async with SolanaRpc([world.net.url]) as rpc:
        lender = await rpc.account_data(mp.lender_address(mp.pool_address(POOL_PAID),
                                                          WALLET.pubkey()))
        assert lender is not None and mp.decode_lender(lender).claimed_redeemable_amount == SHARE


async def test_a_claim_made_stale_elsewhere_is_refused_in_one_line_not_resized(
        world: World) -> None:
    app = funds_app(world.net.url, WALLET, world.proofs)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            panel = await listed(app, pilot, 4)
            await pilot.press("a")
            await pilot.pause()
            assert isinstance(app.screen, FundsClaimScreen) and app.screen.amount == SHARE
            # Meanwhile (pool-claim on another machine): 1 base unit of the share claimed.
            async with SolanaRpc([world.net.url]) as rpc:
                me, r = WALLET.pubkey(), REWARD.pubkey()
                await rpc.send_instructions([ix.create_associated_token_account(me, me, r),
                                             mp.lender_claim(me, POOL_PAID, r, 1)], WALLET)
            await pilot.click("#claim-confirm")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert panel.last_claim == (
                "claim failed: claim from mining pool 3: mining pool program error 6001: "
                "ParamsRedeemableAmountIsTooLarge: more than this lender's unclaimed share of "
                "the rewards (already claimed?)")
            assert cells(app, "pool:3")[3:5] == ["claimed 0.000001", "claimable 333.333332"]
    finally:
        await app.funds.close()  # type: ignore[union-attr]  # given above
    # only the other claim
    assert await token_balance(world.net.url, WALLET.pubkey(), REWARD.pubkey()) == 1


async def test_cancelling_the_claim_sends_nothing(world: World) -> None:
    app = funds_app(world.net.url, WALLET, world.proofs)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            panel = await listed(app, pilot, 4)
            for cancel in ("escape", "n", "#claim-cancel"):
                await pilot.press("a")
                await pilot.pause()
                assert isinstance(app.screen, FundsClaimScreen)
                await (pilot.click(cancel) if cancel.startswith("#") else pilot.press(cancel))
                await pilot.pause()
                assert not isinstance(app.screen, FundsClaimScreen)
            await app.workers.wait_for_complete()
            assert panel.last_claim == ""
    finally:
        await app.funds.close()  # type: ignore[union-attr]  # given above
    assert await token_balance(world.net.url, WALLET.pubkey(), REWARD.pubkey()) == 0
    async with SolanaRpc([world.net.url]) as rpc:
        lender = await rpc.account_data(mp.lender_address(mp.pool_address(POOL_PAID),
                                                          WALLET.pubkey()))
        assert lender is not None and mp.decode_lender(lender).claimed_redeemable_amount == 0


async def test_without_a_proofs_file_the_panel_says_so_and_lists_the_pools(
        world: World, tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{}")
    for proofs, note in (
            (None, "airdrops: no proofs file set (AIRDROP_PROOFS=the file airdrop-create wrote)"),
            (tmp_path / "missing.json", f"airdrops: AIRDROP_PROOFS={tmp_path}/missing.json: "
                                        "no such file"),
            (broken, f"airdrops: AIRDROP_PROOFS={broken}: not a proofs file written by "
                     "airdrop-create (KeyError: 'airdrop_id')")):
        app = funds_app(world.net.url, WALLET, proofs)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                panel = await listed(app, pilot, 2)
                assert [stake.key for stake in panel.rows] == ["pool:3", "pool:4"]
                assert text_of(app, "#funds-notes").splitlines() == [note]
        finally:
            await app.funds.close()  # type: ignore[union-attr]  # given above


async def test_the_panel_is_hidden_and_a_not_offered_without_a_wallet_on_solana() -> None:
    app = RunManagerApp(Dashboard())  # a TCP run: no funds source
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("a")
        await pilot.pause()
        assert not app.query_one(FundsPanel).display
        assert app.check_action("claim_funds", ()) is False
        assert not isinstance(app.screen, FundsClaimScreen)


def test_snapshot_funds_panel_and_claim_dialog(world: World, snap_compare: Any) -> None:
    app = funds_app(world.net.url, WALLET, world.proofs)

    async def ready(pilot: Pilot[None]) -> None:
        await listed(app, pilot, 4)
        await pilot.press("a")
        await pilot.pause()
        await app.funds.close()  # type: ignore[union-attr]  # read; the dialog sends nothing here

    assert snap_compare(app, run_before=ready, terminal_size=(120, 40))


async def test_an_unreachable_cluster_is_one_line_in_the_panel() -> None:
    dashboard = Dashboard()
    app = RunManagerApp(dashboard, wallet_refresh_s=3600,
                        funds=WalletFunds(["http://127.0.0.1:9"], WALLET, None))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            panel = app.query_one(FundsPanel)
            deadline = time.monotonic() + 30
            while not panel.error:
                assert time.monotonic() < deadline
                await pilot.pause(0.1)
            await pilot.pause()
            [line] = text_of(app, "#funds-notes").splitlines()
            assert line.startswith("pools and airdrops: ") and line == panel.error
            assert panel.rows == [] and not app.query_one("#funds-table").display
    finally:
        await app.funds.close()  # type: ignore[union-attr]  # given above


def test_airdrop_proofs_is_a_setting_kept_on_the_host(tmp_path: Path) -> None:
    from run_manager.settings import env_file_warnings, load_settings, read_env_file

    env_file = tmp_path / "run.env"
    env_file.write_text(f"RUN_ID=r\nCOORDINATOR_ADDRESS=127.0.0.1:1\n"
                        f"AIRDROP_PROOFS={tmp_path}/airdrop-9-proofs.json\n")
    settings = load_settings(env_file)
    assert str(settings.AIRDROP_PROOFS) == f"{tmp_path}/airdrop-9-proofs.json"
    variables = read_env_file(env_file)
    assert env_file_warnings(variables, settings) == []  # a key the run-manager reads
    assert "AIRDROP_PROOFS" not in settings.container_environment(variables)  # a host path
