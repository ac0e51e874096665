"""This round's witnesses and the progress toward quorum."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from psyche_common.ui.view import RunView, describe_witnesses


class WitnessPanel(Vertical):
    BORDER_TITLE = "Witnesses"

    def compose(self) -> ComposeResult:
        self.summary = Static(id="witness-summary")
        self.quorum = ProgressBar(id="witness-quorum", show_eta=False, total=1)
        self.members = Static(id="witness-members")
        yield self.summary
        yield self.quorum
        yield self.members

    def on_mount(self) -> None:
        self.summary.update("\n".join(describe_witnesses(None)))

    def show(self, dashboard: RunView) -> None:
        run = dashboard.run
        self.summary.update("\n".join(describe_witnesses(run)))
        if run is None:
            self.quorum.update(total=1, progress=0)
            self.members.update("")
            return
        progress = run.witnesses
        # The bar fills toward quorum: received witness messages over those needed.
        self.quorum.update(total=max(progress.quorum, 1), progress=min(len(progress.received), max(progress.quorum, 1)))
        received = set(progress.received)
        self.members.update(
            "\n".join(f"{'✔' if w in received else '…'} {w}" for w in progress.elected)
        )
