"""The client container: image, state, restarts and a live tail of its log (its events;
the HTTP request lines only in the full-screen log)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import RichLog, Static

from run_manager.view import Dashboard, describe_container, is_http_request_line

TAIL_LINES = 200


class ContainerPanel(Vertical):
    BORDER_TITLE = "Container"

    def compose(self) -> ComposeResult:
        self.summary = Static(id="container-summary")
        self.tail = RichLog(id="container-tail", max_lines=TAIL_LINES, wrap=False, markup=False)
        yield self.summary
        yield self.tail

    def show(self, dashboard: Dashboard) -> None:
        self.summary.update("\n".join(describe_container(dashboard.container)))

    def replay(self, lines: list[str]) -> None:
        """Fills the tail with lines logged before the panel existed."""
        for line in [line for line in lines if not is_http_request_line(line)][-TAIL_LINES:]:
            self.tail.write(line)

    def append_log(self, text: str) -> None:
        # The client's HTTP request lines stay in the full-screen log (l), not here.
        if not is_http_request_line(text):
            self.tail.write(text)
