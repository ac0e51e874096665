"""The wallet: address, SOL balance and, in a Solana run, its rewards (points earned,
claimed and claimable, the reward token balance). Key c claims (run_manager.tui.app)."""

from __future__ import annotations

from textual.widgets import Static

from run_manager.view import Dashboard, describe_wallet


class WalletPanel(Static):
    BORDER_TITLE = "Wallet"

    def show(self, dashboard: Dashboard) -> None:
        self.update("\n".join(describe_wallet(dashboard.wallet)))
