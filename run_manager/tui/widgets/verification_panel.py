"""Verification: the run's reports and ejections, this client's replays of the trainers it
follows, and an alert when the coordinator ejected this client (docs/verification.md).

Hidden while the run does not verify and the client has nothing to tell. The first time it
sees this client ejected (per epoch) it posts `ClientEjected`, which the app turns into a
notification that stays on screen.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from run_manager.tui.messages import ClientEjected
from run_manager.view import Dashboard, describe_verification, ejection_alert


class VerificationPanel(Static):
    BORDER_TITLE = "Verification"
    alerted_epoch: int | None = None  # the ejection already notified

    def show(self, dashboard: Dashboard) -> None:
        lines = describe_verification(dashboard.run, dashboard.metrics)
        alert = ejection_alert(dashboard.run, dashboard.metrics)
        self.display = bool(lines)
        self.set_class(alert is not None, "-ejected")
        text = Text()
        for index, line in enumerate(lines):
            if index:
                text.append("\n")
            text.append(line, style="bold red" if line == alert else "")
        self.update(text)
        metrics = dashboard.metrics
        if alert is not None and metrics is not None and metrics.ejected_epoch != self.alerted_epoch:
            self.alerted_epoch = metrics.ejected_epoch
            self.post_message(ClientEjected(alert))
