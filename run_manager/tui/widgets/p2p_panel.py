"""P2P: the client's upload and download rates and its peers, direct or relayed."""

from __future__ import annotations

from textual.widgets import Static

from run_manager.p2p_view import describe_p2p
from run_manager.view import Dashboard


class P2PPanel(Static):
    BORDER_TITLE = "P2P"

    def show(self, dashboard: Dashboard) -> None:
        self.update("\n".join(describe_p2p(dashboard.p2p)))
