"""The claim sends exactly what its dialog showed, and the Wallet panel follows the chain
(issue 35, item 2): the dialog said "Claim 10000000 points" and 20000000 were claimed (the
chain had credited more since the panel was read), and after the run the panel's earned
and SOL balance stayed stale. A real treasurer run (our programs in LiteSVM, an epoch
played) served over JSON-RPC to the real `SolanaRewards`; the TUI driven by Pilot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from test_rm_tui import text_of
from test_rm_tui_rewards import OPERATOR

from psyche_common.wallet import format_sol
from psyche_solana.localnet import Localnet, LocalValidator
from psyche_solana.rewards import RewardStatus
from psyche_solana.rpc import SolanaRpc
from psyche_solana.scenario import SvmRun
from run_manager.rewards import RewardsUnavailable, SolanaRewards
from run_manager.tui.app import RunManagerApp
from run_manager.tui.widgets import ClaimScreen
from run_manager.view import Dashboard
from tests.run_manager.tui_setup import played_treasurer_run

EARNED = 500  # an epoch's points for each of the two clients


@pytest.fixture
def funded_run() -> Iterator[tuple[Localnet, SvmRun, str]]:
    """An epoch played by the operator and another client; the vault holds enough."""
    run = played_treasurer_run(OPERATOR)
    assert run.account().earned(OPERATOR.pubkey()) == EARNED
    run.top_up(10 * EARNED)
    with Localnet(validator=LocalValidator(run.svm)) as net:
        yield net, run, run.account().run_id


async def sol_balance(net: Localnet) -> int:
    async with SolanaRpc([net.url]) as rpc:
        return await rpc.balance(OPERATOR.pubkey())


async def test_the_claim_sends_what_the_dialog_showed_then_the_panel_reads_the_chain(
        funded_run: tuple[Localnet, SvmRun, str]) -> None:
    net, run, run_id = funded_run
    rewards = SolanaRewards([net.url], run_id, OPERATOR)
    dashboard = Dashboard()
    dashboard.wallet.address = str(OPERATOR.pubkey())
    dashboard.wallet.balance_lamports = 7 * 10**9  # stale, as the panel's numbers were
    # The panel was read when 300 points were earned; the chain has 500 by now.
    mint = (await rewards.status()).mint
    dashboard.wallet.apply_rewards(RewardStatus(300, 0, mint, 6, 0))
    app = RunManagerApp(dashboard, rewards=rewards, wallet_refresh_s=3600)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("c")
            await pilot.pause()
            dialog = app.screen
            assert isinstance(dialog, ClaimScreen) and dialog.points == 300
            assert dialog.question.startswith("Claim 300 points = 0.0003 reward tokens")
            await pilot.click("#claim-confirm")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert run.token_balance(OPERATOR.pubkey()) == 300  # not the chain's 500
            lines = text_of(app, "#wallet").splitlines()
            assert lines[-1] == "claimed 300 points: reward token balance now 0.0003"
            # earned, claimed and the SOL balance (a fee and a token account paid) read afresh
            balance = await sol_balance(net)
            assert balance < 10**9
            assert lines[0] == (f"wallet {OPERATOR.pubkey()}  balance {format_sol(balance)}  "
                                f"points {EARNED}")
            assert lines[1] == (f"rewards: {EARNED} earned · 300 claimed · 200 claimable · "
                                "reward token 0.0003 (300 base units)")
    finally:
        await rewards.close()


async def test_the_wallet_panel_refreshes_on_its_own_with_no_run_going(
        funded_run: tuple[Localnet, SvmRun, str]) -> None:
    net, run, run_id = funded_run
    rewards = SolanaRewards([net.url], run_id, OPERATOR)
    dashboard = Dashboard()
    dashboard.wallet.address = str(OPERATOR.pubkey())
    app = RunManagerApp(dashboard, rewards=rewards, wallet_refresh_s=0.2)  # no supervisor
    try:
        async with app.run_test(size=(120, 40)) as pilot:

            async def panel_shows(*texts: str) -> None:
                deadline = time.monotonic() + 20
                while not all(text in text_of(app, "#wallet") for text in texts):
                    assert time.monotonic() < deadline, (texts, text_of(app, "#wallet"))
                    await pilot.pause(0.1)

            await panel_shows(f"balance {format_sol(await sol_balance(net))}  points {EARNED}",
                              f"0 claimed · {EARNED} claimable")
            # Elsewhere (the CLI, another machine): a claim and SOL sent to the wallet.
            run.claim(OPERATOR, 120)
            run.svm.airdrop(OPERATOR.pubkey(), 2 * 10**9)
            balance = await sol_balance(net)
            assert balance > 2 * 10**9
            await panel_shows(f"balance {format_sol(balance)}  points {EARNED}",
                              "120 claimed · 380 claimable")
    finally:
        await rewards.close()


async def test_a_claim_of_nothing_is_refused_before_any_transaction() -> None:
    rewards = SolanaRewards(["http://127.0.0.1:9"], "r", OPERATOR)  # never asked
    with pytest.raises(RewardsUnavailable, match=r"^claim: 0 points: nothing to claim$"):
        await rewards.claim(0)
    await asyncio.sleep(0)
