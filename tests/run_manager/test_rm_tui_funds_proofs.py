"""The Pools & airdrops panel reads several proofs files (issue 37 leftover): AIRDROP_PROOFS
names one file, several separated by commas, or directories of them. Each allocation of
the wallet is listed once, a stale proofs file of an updated airdrop giving way to the one
matching its root; files in a directory that are not proofs files are passed over in one
note; a claim from the second file's airdrop sends what its dialog showed.

Our distributor program in LiteSVM behind the JSON-RPC server on loopback, airdrops made
and updated by real transactions, the real WalletFunds, the TUI driven by Pilot.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from solders.keypair import Keypair
from test_rm_tui import text_of
from test_rm_tui_funds import cells, listed

from psyche_solana import distributor as dist
from psyche_solana import instructions as ix
from psyche_solana.localnet import Localnet
from psyche_solana.merkle import Allocation, Vesting
from psyche_solana.rpc import SolanaRpc
from run_manager.commands.airdrop import proofs_json
from run_manager.tui.app import RunManagerApp
from tests.run_manager.tui_setup import claim_dialog_on_row, funds_app, token_balance

pytestmark = pytest.mark.timeout(60)

WALLET, AUTHORITY, OTHER, MINT = (Keypair() for _ in range(4))
M = 10**6  # the mint has 6 decimals
UPDATED, SECOND = 21, 22  # airdrop ids


@dataclass
class World:
    net: Localnet
    drops: Path  # a directory: airdrop 21's stale and current proofs, an allocations file
    second: Path  # airdrop 22's proofs file, elsewhere


def _allocations(wallet_amount: int) -> list[Allocation]:
    past = int(time.time()) - 1000
    return [Allocation(bytes(WALLET.pubkey()), 0, Vesting(past, 0, wallet_amount)),
            Allocation(bytes(OTHER.pubkey()), 0, Vesting(past, 0, 1 * M))]


async def _build(url: str, drops: Path, second: Path) -> None:
    """Airdrop 21: WALLET had 2 tokens, then the authority updated it to 4 (both proofs
    files kept). Airdrop 22: WALLET has 3 tokens, all vested."""
    async with SolanaRpc([url]) as rpc:
        me, mint = AUTHORITY.pubkey(), MINT.pubkey()
        for key in (AUTHORITY, WALLET):
            await rpc.airdrop(key.pubkey(), 10**10)
        rent = await rpc.minimum_balance(ix.MINT_SIZE)
        await rpc.send_instructions(ix.create_mint(me, mint, rent, 6, me), AUTHORITY, [MINT])
        await rpc.send_instructions([ix.create_associated_token_account(me, me, mint),
                                     ix.mint_to(mint, ix.associated_token_address(me, mint), me,
                                                100 * M)], AUTHORITY)
        stale = proofs_json(UPDATED, mint, 6, _allocations(2 * M))
        await dist.create_and_fund(rpc, AUTHORITY, UPDATED, mint,
                                   bytes.fromhex(stale["merkle_root"]), 3 * M, 6)
        current = proofs_json(UPDATED, mint, 6, _allocations(4 * M))
        await dist.update(rpc, AUTHORITY, UPDATED, merkle_root=bytes.fromhex(
            current["merkle_root"]), allocated_total=5 * M, decimals=6)
        # sorted, the stale file comes first and must give way to the current one
        (drops / "airdrop-21-proofs-old.json").write_text(json.dumps(stale))
        (drops / "airdrop-21-proofs.json").write_text(json.dumps(current))
        (drops / "allocations.json").write_text(json.dumps([{"claimer": str(WALLET.pubkey())}]))
        other = proofs_json(SECOND, mint, 6, _allocations(3 * M))
        await dist.create_and_fund(rpc, AUTHORITY, SECOND, mint,
                                   bytes.fromhex(other["merkle_root"]), 4 * M, 6)
        second.write_text(json.dumps(other))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("proofs")
    drops, elsewhere = root / "drops", root / "elsewhere"
    drops.mkdir()
    elsewhere.mkdir()
    with Localnet() as net:
        built = World(net, drops, elsewhere / "airdrop-22-proofs.json")
        asyncio.run(_build(net.url, built.drops, built.second))
        yield built


def airdrop_notes(app: RunManagerApp) -> list[str]:
    """The panel's notes about airdrops (the pools' own come first)."""
    return [line for line in text_of(app, "#funds-notes").splitlines()
            if line.startswith("airdrops: ")]


async def test_a_directory_and_a_file_list_each_allocation_once_and_claim(world: World) -> None:
    app = funds_app(world.net.url, WALLET, f"{world.drops}, {world.second}")
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            panel = await listed(app, pilot, 2)
            assert [stake.key for stake in panel.rows] == ["airdrop:21:0", "airdrop:22:0"]
            assert cells(app, "airdrop:21:0")[:5] == [  # the updated allocation, not the stale
                "airdrop 21 #0", "allocated 4", "vested 4", "claimed 0", "claimable 4"]
            assert cells(app, "airdrop:22:0")[:5] == [
                "airdrop 22 #0", "allocated 3", "vested 3", "claimed 0", "claimable 3"]
            assert airdrop_notes(app) == [
                f"airdrops: AIRDROP_PROOFS: {world.drops}: not proofs files, passed over: "
                "allocations.json"]

            dialog = await claim_dialog_on_row(app, pilot, 1)
            assert dialog.amount == 3 * M
            assert "from airdrop 22, allocation #0" in dialog.question
            await pilot.press("y")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert await token_balance(world.net.url, WALLET.pubkey(), MINT.pubkey()) == 3 * M
            assert cells(app, "airdrop:22:0")[3:5] == ["claimed 3", "claimable 0"]
    finally:
        await app.funds.close()  # type: ignore[union-attr]  # given above


async def test_missing_stale_and_empty_entries_are_notes_next_to_the_good_ones(
        world: World, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = tmp_path / "missing.json"
    stale = world.drops / "airdrop-21-proofs-old.json"
    app = funds_app(world.net.url, WALLET, f"{missing},{empty},{stale},{world.second},")
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            panel = await listed(app, pilot, 1)
            assert [stake.key for stake in panel.rows] == ["airdrop:22:0"]
            assert airdrop_notes(app) == [
                f"airdrops: AIRDROP_PROOFS={missing}: no such file",
                f"airdrops: AIRDROP_PROOFS: {empty} holds no *.json proofs file",
                "airdrops: the proof of nonce 0 in airdrop-21-proofs-old.json does not match "
                "airdrop 21's Merkle root"]
    finally:
        await app.funds.close()  # type: ignore[union-attr]  # given above
