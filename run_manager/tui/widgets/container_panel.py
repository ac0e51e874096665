"""The client container: image, state, restarts, a progress bar while its image is
pulled, and a live tail of its log (its events; the HTTP request lines only in the
full-screen log)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, RichLog, Static

from run_manager.view import Dashboard, describe_container, is_http_request_line

TAIL_LINES = 200


class ContainerPanel(Vertical):
    BORDER_TITLE = "Container"

    def compose(self) -> ComposeResult:
        self.summary = Static(id="container-summary")
        self.pull = ProgressBar(id="container-pull", show_eta=False)
        self.pull.display = False
        self.tail = RichLog(id="container-tail", max_lines=TAIL_LINES, wrap=False, markup=False)
        yield self.summary
        yield self.pull
        yield self.tail

    def show(self, dashboard: Dashboard) -> None:
        view = dashboard.container
        self.summary.update("\n".join(describe_container(view)))
        # The pull's layers are summed as the engine reports them: shown once a size is known.
        pulling = view.state == "pulling" and view.pull_total_bytes > 0
        self.pull.display = pulling
        if pulling:
            self.pull.update(total=view.pull_total_bytes, progress=view.pull_current_bytes)

    def replay(self, lines: list[str]) -> None:
        """Fills the tail with lines logged before the panel existed."""
        for line in [line for line in lines if not is_http_request_line(line)][-TAIL_LINES:]:
            self.tail.write(line)

    def append_log(self, text: str) -> None:
        # The client's HTTP request lines stay in the full-screen log (l), not here.
        if not is_http_request_line(text):
            self.tail.write(text)
