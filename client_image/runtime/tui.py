"""`psyche-client train --logs tui`: the client's own live view.

It uses the shared panels (psyche_common.ui: run, witnesses, training) and adds the client's event
stream and its library log; the client runs as a worker on the app's event loop, and q
stops it cleanly (the app's exit code is the client's). While the run verifies
(docs/verification.md) a line above the panels shows the trainers this client follows,
its replays' verdicts and the reports it sent; an `Ejected` event turns it into a notice
(and a notification) naming the followers whose reports ejected this client. A `Removed`
event (the coordinator took this client out of an epoch, runtime/removal.py) is a
notification, and a line of the Training panel says why.
"""

from __future__ import annotations

import logging
import time
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid
from textual.widgets import Footer, Header, RichLog, Static

from client_image.runtime.client import PsycheClient
from client_image.runtime.events import Ejected, Following, Removed, RuntimeEvent
from client_image.runtime.observability import Counters
from psyche_common.run_view import ObservedState, build_snapshot
from psyche_common.ui.run_panel import RunPanel
from psyche_common.ui.training_panel import TrainingPanel
from psyche_common.ui.view import RunView
from psyche_common.ui.witness_panel import WitnessPanel


class _ToLog(logging.Handler):
    """Library logging goes to the events panel: stderr would tear the screen."""

    def __init__(self, app: ClientApp):
        super().__init__(logging.INFO)
        self.app = app

    def emit(self, record: logging.LogRecord) -> None:
        self.app.add_line(f"{record.levelname.lower()} {record.name}: {record.getMessage()}")


class ClientApp(App[int]):
    TITLE = "psyche client"
    CSS = """
    #client-panels { grid-size: 2 2; grid-columns: 1fr 1fr; grid-rows: 1fr 1fr; height: 1fr; }
    RunPanel, WitnessPanel, TrainingPanel, #client-events {
        border: round $primary; border-title-color: $accent; border-title-style: bold;
    }
    #run-summary, #witness-summary, #training-summary { height: auto; }
    #run-clients, #training-loss { height: 1fr; }
    #client-verification { height: auto; padding: 0 1; display: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "stop_client", "Stop & quit")]

    def __init__(self, client: PsycheClient, refresh_s: float = 0.5):
        super().__init__()
        self.client = client
        self.dashboard = RunView()
        self.refresh_s = refresh_s
        client.events.listeners.append(self._on_event)
        self._log_handler = _ToLog(self)
        self.following: Following | None = None  # this epoch's, from the event
        self.ejected: Ejected | None = None

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static(id="client-verification")
        with Grid(id="client-panels"):
            yield RunPanel()
            yield WitnessPanel()
            yield TrainingPanel()
            events = RichLog(id="client-events", max_lines=2000, wrap=True)
            events.border_title = "Events"
            yield events
        yield Footer()

    def on_mount(self) -> None:
        logging.getLogger().addHandler(self._log_handler)
        self.set_interval(self.refresh_s, self.refresh_panels)
        self.run_worker(self._run_client(), name="client", exclusive=True)

    def on_unmount(self) -> None:
        logging.getLogger().removeHandler(self._log_handler)

    async def _run_client(self) -> None:
        code = await self.client.run()
        self.exit(code)

    def add_line(self, text: str) -> None:
        if self.is_running:
            self.query_one("#client-events", RichLog).write(text)

    def _on_event(self, event: RuntimeEvent) -> None:
        details = " ".join(f"{k}={v}" for k, v in event.fields().items())
        self.add_line(f"{time.strftime('%H:%M:%S')} [b]{event.NAME}[/b] {details}")
        match event:
            case Following():
                self.following = event
            case Ejected():
                # ejected: out of the epoch, it follows nobody any more
                self.ejected = event
                self.following = Following(epoch=event.epoch, trainers=())
                if self.is_running:
                    self.notify(ejected_notice(event), title="ejected", severity="error",
                                timeout=600)
                    self.refresh_verification()
            case Removed():
                # Also a line of the Training panel (from the metrics); the notice says it now.
                if self.is_running:
                    self.notify(f"epoch {event.epoch}, step {event.step}: {event.detail}",
                                title=f"taken out of the epoch ({event.reason})",
                                severity="warning", timeout=600)
            case _:
                pass

    def refresh_verification(self) -> None:
        state = self.client.state
        percent = None if state is None else state.config.verification_percent
        lines = verification_lines(percent, self.following, self.client.counters)
        notice = None if self.ejected is None else ejected_notice(self.ejected)
        widget = self.query_one("#client-verification", Static)
        widget.display = bool(lines) or notice is not None
        text = Text("\n".join(lines))
        if notice is not None:
            text.append(("\n" if lines else "") + notice, style="bold red")
        widget.update(text)

    def refresh_panels(self) -> None:
        if not self.is_running:  # shutting down: the timer can fire after the widgets went
            return
        received = self.client.last_server_state
        if received is not None:
            server_state, at = received
            self.dashboard.apply_run(build_snapshot(ObservedState(
                server_state.state, server_state.server_time, at, connection=0)))
        self.dashboard.apply_metrics(self.client.metrics())
        self.query_one(RunPanel).show(self.dashboard)
        self.query_one(WitnessPanel).show(self.dashboard)
        self.query_one(TrainingPanel).show(self.dashboard)
        self.refresh_verification()

    def action_stop_client(self) -> None:
        self.client.stop()


def verification_lines(percent: int | None, following: Following | None,
                       counters: Counters) -> list[str]:
    """"verification 50%: following 2 trainers · 14 passed · 1 failed · 1 report sent";
    nothing while the run does not verify (percent 0; None: not known yet) and this client
    verified nothing."""
    checked = (counters.verifications_passed + counters.verifications_failed
               + counters.verification_reports_sent)
    if not percent and not checked:
        return []
    if following is None:
        whom = "following no trainer yet"
    elif not following.able:
        whom = "following nobody (this client cannot replay a model split over ranks)"
    else:
        count = len(following.trainers)
        whom = f"following {count} trainer{'' if count == 1 else 's'}"
    reports = counters.verification_reports_sent
    share = "" if percent is None else f" {percent}%"
    return [f"verification{share}: {whom} · {counters.verifications_passed} passed · "
            f"{counters.verifications_failed} failed · "
            f"{reports} report{'' if reports == 1 else 's'} sent"]


def ejected_notice(event: Ejected) -> str:
    """"EJECTED in epoch 3 by 2 followers (ab12cd…, ef34ab…)": their replays of this
    client's results did not match what it published."""
    count = len(event.reporters)
    names = ", ".join(f"{r[:12]}…" for r in event.reporters)
    return (f"EJECTED in epoch {event.epoch} by {count} follower{'' if count == 1 else 's'}"
            + (f" ({names})" if names else "")
            + ": their replays did not reproduce this client's results")
