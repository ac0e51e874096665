"""The run: phase with its timer, epoch, step, and the clients with their states (each
named by `RunView.client_label`)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from psyche_common.ui.view import RunView, describe_run

MAX_CLIENT_ROWS = 256  # the coordinator lists at most 256 clients


class RunPanel(Vertical):
    BORDER_TITLE = "Run"

    def compose(self) -> ComposeResult:
        self.summary = Static(id="run-summary")
        self.clients: DataTable[str] = DataTable(id="run-clients", show_cursor=False, zebra_stripes=True)
        yield self.summary
        yield self.clients

    def on_mount(self) -> None:
        self.clients.add_columns("client", "state", "points")
        self.summary.update("\n".join(describe_run(None)))

    def show(self, dashboard: RunView) -> None:
        run = dashboard.run
        self.summary.update("\n".join(describe_run(run)))
        self.clients.clear()
        for client in (run.clients if run is not None else [])[:MAX_CLIENT_ROWS]:
            points = "—" if client.points is None else str(client.points)
            self.clients.add_row(dashboard.client_label(client.id), client.state, points,
                                 key=client.id)
