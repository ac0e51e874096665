"""The Run panel with the coordinator's health on top: the shared panel
(psyche_common.ui.run_panel) shows the run's last state, which a coordinator that died or
hangs leaves as it was; here a red line says so (run_manager.coordinator_health)."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.widgets import Static

from psyche_common.ui.run_panel import RunPanel
from psyche_common.ui.view import RunView
from run_manager.coordinator_health import describe_coordinator_health
from run_manager.view import Dashboard


class CoordinatorRunPanel(RunPanel):
    def compose(self) -> ComposeResult:
        self.alert = Static(id="run-alert")
        self.alert.display = False
        yield self.alert
        yield from super().compose()

    def show(self, dashboard: RunView) -> None:
        super().show(dashboard)
        lines: list[str] = []
        if isinstance(dashboard, Dashboard):
            lines = describe_coordinator_health(dashboard.run, dashboard.coordinator_heard,
                                                dashboard.coordinator_error, time.monotonic())
        self.alert.update("\n".join(lines))
        self.alert.display = bool(lines)
