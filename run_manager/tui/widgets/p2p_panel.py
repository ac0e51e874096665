"""P2P: the client's upload and download rates, its peers, direct or relayed, and a
progress bar while it fetches the model from its peers (at a warm-up)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from run_manager.p2p_view import describe_p2p, model_fetching
from run_manager.view import Dashboard


class P2PPanel(Vertical):
    BORDER_TITLE = "P2P"

    def compose(self) -> ComposeResult:
        self.summary = Static(id="p2p-summary")
        self.model = ProgressBar(id="p2p-model", show_eta=False)
        self.model.display = False
        yield self.summary
        yield self.model

    def show(self, dashboard: Dashboard) -> None:
        view = dashboard.p2p
        self.summary.update("\n".join(describe_p2p(view)))
        self.model.display = model_fetching(view)
        if self.model.display:
            self.model.update(total=view.model_total, progress=view.model_downloaded)
