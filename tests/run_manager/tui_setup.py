"""Setups shared by the run-manager's TUI tests: the Pools & airdrops panel's app, its
claim dialog opened on a row and a wallet's token balance (test_rm_tui_funds*.py), a treasurer run with an epoch played
(test_rm_tui_claim.py, test_rm_tui_rewards.py) and a verification with an ejection
(test_rm_tui_verification.py)."""

from __future__ import annotations

from pathlib import Path

from solders.keypair import Keypair
from solders.pubkey import Pubkey
from textual.pilot import Pilot
from textual.widgets import DataTable

from psyche_common.run_view import RunReport, RunVerification
from psyche_solana import instructions as ix
from psyche_solana.rpc import SolanaRpc
from psyche_solana.scenario import SvmRun
from run_manager.funds import WalletFunds
from run_manager.tui.app import RunManagerApp
from run_manager.tui.widgets.funds_claim_screen import FundsClaimScreen
from run_manager.view import Dashboard
from tests.solana.test_differential import small_run_state


def funds_app(url: str, wallet: Keypair, proofs: str | Path | None) -> RunManagerApp:
    """The TUI with `wallet`'s real WalletFunds on `url` (AIRDROP_PROOFS=`proofs`); the
    wallet is not read again during a test."""
    dashboard = Dashboard()
    dashboard.wallet.address = str(wallet.pubkey())
    return RunManagerApp(dashboard, wallet_refresh_s=3600,
                         funds=WalletFunds([url], wallet, proofs))


async def claim_dialog_on_row(app: RunManagerApp, pilot: Pilot[None],
                              row: int) -> FundsClaimScreen:
    """The claim dialog that enter on the Pools & airdrops table's row `row` opens."""
    table = app.query_one("#funds-table", DataTable)
    table.focus()
    table.move_cursor(row=row)
    await pilot.press("enter")
    await pilot.pause()
    dialog = app.screen
    assert isinstance(dialog, FundsClaimScreen)
    return dialog


async def token_balance(url: str, owner: Pubkey, mint: Pubkey) -> int:
    """`owner`'s balance of `mint` in base units: 0 while it has no token account."""
    async with SolanaRpc([url]) as rpc:
        data = await rpc.account_data(ix.associated_token_address(owner, mint))
        return 0 if data is None else ix.token_amount(data)


def played_treasurer_run(operator: Keypair) -> SvmRun:
    """A treasurer run (our programs in LiteSVM) with one epoch played by `operator` and
    another client, at 1000 points per epoch; its reward vault still empty."""
    run = SvmRun.create(small_run_state(2, 2, 1, 10), treasurer=True)
    other = Keypair()
    for key in (operator, other):
        run.svm.airdrop(key.pubkey(), 10**9)
    run.authorize_permissionless()
    run.set_rates(1000, None)
    run.join(operator)
    run.join(other)
    run.svm.advance(2)
    run.tick()
    run.play_epoch([operator, other])
    return run


def eject(dashboard: Dashboard, accused: str, reports: list[RunReport]) -> None:
    """The coordinator's view once `reports` ejected `accused`: its client listed as
    Ejected, the epoch's verification at 50% with those reports."""
    assert dashboard.run is not None
    clients = [c.model_copy(update={"state": "Ejected"}) if c.id == accused else c
               for c in dashboard.run.clients]
    dashboard.apply_run(dashboard.run.model_copy(update={
        "clients": clients,
        "verification": RunVerification(percent=50, reports=reports, ejected=[accused])}))
