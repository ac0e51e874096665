"""The coordinator server's TUI (`psyche-coordinator run --tui true`).

Dashboard: run id and address, phase with its timer, epoch, step, round height, what the
run waits for ("waiting for 3 clients, 2 connected", "warming up: 1 of 2 ready"), this
round's witnesses against the quorum, the clients and their states, the epoch's
verification reports and ejected clients (when verification is on), samples served by
the data server, and the server's log. Ctrl+P pauses the run (or resumes a paused one),
as in Psyche's server dashboard. Refreshes twice a second from the live server object
(same event loop, so no locking is needed). q, ctrl+c and ctrl+q stop the server, as
SIGINT, SIGTERM and SIGHUP do: the status says "stopping…" and the app exits (the runner
then closes the connections and saves the state).
"""

from __future__ import annotations

import contextlib
import logging
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.driver import Driver
from textual.widgets import DataTable, Footer, Header, RichLog, Static

from coordinator import RunState
from coordinator_tcp.data_server import DataServer
from coordinator_tcp.server import CoordinatorServer
from coordinator_tcp.summary import summarize
from coordinator_tcp.telemetry import ejected_clients
from psyche_common.stopping import hangup_safe_driver
from psyche_common.ui.view import describe_model_lost, describe_model_resets

MAX_EJECTED_NAMES = 4


class _TuiLogHandler(logging.Handler):
    def __init__(self, app: CoordinatorApp):
        super().__init__(level=logging.INFO)
        self.app = app
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # the TUI may be gone while the server still logs
            self.app.add_log_line(self.format(record))


class CoordinatorApp(App[None]):
    TITLE = "psyche coordinator"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+p", "toggle_pause", "pause/resume", priority=True),
        Binding("q", "quit", "stop"),
    ]
    CSS = """
    #status { height: auto; padding: 0 1; border: round $accent; }
    #clients { height: 1fr; border: round $accent; }
    #data { height: 1fr; border: round $accent; }
    #log { height: 12; border: round $accent; }
    """

    def __init__(self, server: CoordinatorServer, data_server: DataServer | None = None):
        super().__init__()
        self.server = server
        self.data_server = data_server
        self._handler = _TuiLogHandler(self)
        self.last_action = ""
        self.stopping: str | None = None  # why, once stopping

    def get_driver_class(self) -> type[Driver]:
        return hangup_safe_driver(super().get_driver_class())

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="status")
        with Horizontal():
            yield DataTable(id="clients")
            with Vertical(id="data"):
                yield DataTable(id="served")
        yield RichLog(id="log", max_lines=500)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#clients", DataTable).add_columns("#", "client", "state", "connected")
        self.query_one("#served", DataTable).add_columns("client", "samples served")
        logging.getLogger().addHandler(self._handler)
        self.refresh_view()
        self.set_interval(0.5, self.refresh_view)

    def on_unmount(self) -> None:
        logging.getLogger().removeHandler(self._handler)

    def add_log_line(self, line: str) -> None:
        self.query_one("#log", RichLog).write(line)

    def status_text(self) -> str:
        s = summarize(self.server.state, self.server.now(),
                      {p.key for p in self.server.peers}, pending=self.server.pending,
                      replay_classes=self.server.replay_classes())
        pause = "  (pause pending)" if s.paused_pending else ""
        return (
            f"run {s.run_id}  on {self.server.options.host}:{self.server.port}\n"
            f"phase {s.phase} {s.phase_timer}{pause}   epoch {s.epoch}   "
            f"step {s.step}/{s.total_steps}   height {s.height}\n"
            + (f"{s.waiting}\n" if s.waiting else "")
            + f"witnesses {s.witnesses}/{s.witness_target} (quorum {s.quorum})   "
            f"clients {len(s.clients)}   connected {len(self.server.peers)}   "
            f"checkpoint {s.checkpoint}   Ctrl+P pause/resume"
            + (f"\n{verification}" if (verification := self.verification_text()) else "")
            + (f"\n{reset}" if (reset := self.model_reset_text()) else "")
            + (f"\n{self.last_action}" if self.last_action else "")
            + (f"\nstopping… ({self.stopping})" if self.stopping else ""))

    def model_reset_text(self) -> str:
        """Whether the run waits for a holder of its lost model, and how often it went back
        to its stored checkpoint; "" while neither."""
        state = self.server.state
        lines = (describe_model_lost(state.model_lost), describe_model_resets(state.model_resets))
        return "\n".join(line for line in lines if line is not None)

    def verification_text(self) -> str:
        """The epoch's verification reports and ejected clients; "" while verification is
        off and nothing was reported."""
        state = self.server.state
        percent, reports = state.config.verification_percent, state.epoch_state.reports
        if percent <= 0 and not reports:
            return ""
        ejected = ejected_clients(state)
        names = ", ".join(c.id.key.hex()[:16] for c in ejected[:MAX_EJECTED_NAMES])
        if len(ejected) > MAX_EJECTED_NAMES:
            names += f", +{len(ejected) - MAX_EJECTED_NAMES}"
        return (f"verification {percent}%   reports {len(reports)} this epoch   "
                f"ejected {len(ejected)}" + (f" ({names})" if names else ""))

    def stop_for(self, reason: str) -> None:
        """Say "stopping…" and exit once that is on screen (a signal, or a key)."""
        if self.stopping is not None:
            return
        self.stopping = reason
        with contextlib.suppress(Exception):  # not running yet, or already unmounting
            self.query_one("#status", Static).update(self.status_text())
            self.call_after_refresh(self.exit)

    async def action_quit(self) -> None:
        self.stop_for("quit")

    def action_help_quit(self) -> None:  # ctrl+c: stop, as SIGINT does (not "press ctrl+q")
        self.stop_for("ctrl+c")

    def refresh_view(self) -> None:
        if not self.is_running:  # shutting down: the timer can fire after the widgets went
            return
        self.query_one("#status", Static).update(self.status_text())
        summary = summarize(self.server.state, self.server.now(),
                            {p.key for p in self.server.peers})
        table = self.query_one("#clients", DataTable)
        table.clear()
        for row in summary.clients:
            table.add_row(str(row.index), row.key_hex[:16], row.state,
                          "yes" if row.connected else "no")
        served = self.query_one("#served", DataTable)
        served.clear()
        if self.data_server is not None:
            for key, count in sorted(self.data_server.samples_served.items()):
                served.add_row(key[:16], str(count))

    def action_toggle_pause(self) -> None:
        now = self.server.now()
        coordinator = self.server.coordinator
        if self.server.state.run_state is RunState.Paused:
            rejected = coordinator.resume(now)
            verb = "resume"
        else:
            rejected = coordinator.pause(now)
            verb = "pause"
        self.last_action = f"{verb}: {rejected}" if rejected else f"{verb}: ok"
        logging.getLogger("coordinator_tcp").info("operator %s: %s", verb,
                                                  rejected or "accepted")
        self.server.publish()
        self.refresh_view()
