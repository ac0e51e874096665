"""The wallet: address, balance and reward points."""

from __future__ import annotations

from textual.widgets import Static

from run_manager.view import Dashboard, describe_wallet


class WalletPanel(Static):
    BORDER_TITLE = "Wallet"

    def show(self, dashboard: Dashboard) -> None:
        self.update("\n".join(describe_wallet(dashboard.wallet)))
