"""The `psyche-testnet --tui` screen: the coordinator's state and every client's metrics.

The server part comes from the testnet's observer connection: the phase with its timer
(on the coordinator's clock), what the run waits for ("waiting for 3 clients, 2
connected", "warming up: 1 of 2 ready"), the clients and witnesses. Each client row comes
from its metrics endpoint (http://127.0.0.1:6269+i, `run_manager.sources.ClientMetrics`),
polled every second, with the process status and the last log line in words when the
endpoint is down, and its part in the round's witnessing (local_testnet/witness_state.py).
Below: the run's loss by step (the clients' mean) and the processes' new log lines in
words (local_testnet/widgets). When the TUI exits, the testnet's result (the headless
JSON line) is printed in words (local_testnet/summary_words.py).
`q` (or ctrl+q) stops the testnet, every process it started; ctrl+c, SIGINT, SIGTERM and
SIGHUP (the terminal closed) too: the screen says "stopping…", the app exits and the
processes are stopped (`Testnet.stop`), saying so on stderr; a second signal kills them
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import TYPE_CHECKING, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.driver import Driver
from textual.widgets import DataTable, Footer, Header, Static

from coordinator_tcp.summary import summarize
from local_testnet.client_log import describe_line, log_path
from local_testnet.testnet import client_key
from local_testnet.widgets import LogPane, LogTail, LossPlot, mean_losses
from local_testnet.witness_state import witness_states
from psyche_common.metrics_source import HttpClientMetricsSource
from psyche_common.stopping import StopSignals, hangup_safe_driver, run_app_until_stopped
from psyche_common.ui.view import describe_model_lost, describe_model_resets

if TYPE_CHECKING:
    from local_testnet.testnet import Testnet

STATUS_WIDTH = 60  # characters of a client's last log line in the status column


class TestnetApp(App[None]):
    __test__ = False  # not a pytest test class, despite the name

    TITLE = "psyche testnet"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "stop the testnet")]
    CSS = """
    #server { height: auto; padding: 0 1; border: round $accent; }
    #clients { height: auto; max-height: 12; }
    #below { height: 1fr; min-height: 10; }
    #loss, #logs { width: 1fr; border: round $primary; border-title-color: $accent; }
    """

    def __init__(self, testnet: Testnet):
        super().__init__()
        self.testnet = testnet
        self._sources: dict[int, HttpClientMetricsSource] = {}
        self.stopping: str | None = None  # why, once stopping
        # From each log's size now: a reused work dir's old lines are not this run's.
        work_dir = testnet.options.work_dir
        files = {"coordinator": work_dir / "server.log",
                 **{f"client {i}": log_path(work_dir, i) for i in testnet.clients}}
        self._tails = {name: LogTail(path, LogTail.size_of(path)) for name, path in files.items()}

    def get_driver_class(self) -> type[Driver]:
        return hangup_safe_driver(super().get_driver_class())

    def stop_for(self, reason: str) -> None:
        """Say "stopping…" and exit once that is on screen (a signal, or a key)."""
        if self.stopping is not None:
            return
        self.stopping = reason
        with contextlib.suppress(Exception):  # not running yet, or already unmounting
            self.query_one("#server", Static).update(self.server_text())
            self.call_after_refresh(self.exit)

    async def action_quit(self) -> None:
        self.stop_for("quit")

    def action_help_quit(self) -> None:  # ctrl+c: stop, as SIGINT does (not "press ctrl+q")
        self.stop_for("ctrl+c")

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("waiting for the coordinator…", id="server")
        yield DataTable(id="clients")
        with Horizontal(id="below"):
            yield LossPlot(id="loss")
            yield LogPane(self._tails, id="logs")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one("#clients", DataTable).add_columns(
            "client", "process", "phase", "epoch", "step", "loss", "tok/s", "peers", "witness",
            "status")
        ports = self.testnet.metrics_ports.ports
        self._sources = {i: HttpClientMetricsSource(ports[i], timeout_s=0.5)
                         for i in self.testnet.clients}
        self.set_interval(1.0, self.refresh_view)

    async def on_unmount(self) -> None:
        for source in self._sources.values():
            await source.close()

    def server_text(self) -> str:
        net = self.testnet
        if self.stopping is not None:
            return (f"stopping… ({self.stopping}): the clients, then the coordinator\n"
                    f"work dir {net.options.work_dir}")
        if net.state is None:
            return "waiting for the coordinator…"
        s = summarize(net.state, self.server_now(), joined=net.joined)
        # Before an epoch the state lists no clients: the waiting line says who is there.
        between_epochs = s.phase in ("Uninitialized", "WaitingForMembers")
        run = [s.waiting] if s.waiting else []
        if not between_epochs:
            run.append(f"clients {len(s.clients)}  witnesses {s.witnesses}/{s.witness_target}"
                       f" (quorum {s.quorum})")
        return (f"run {s.run_id}  phase {s.phase} {s.phase_timer}  epoch {s.epoch}  "
                f"step {s.step}/{s.total_steps}\n"
                + "  ·  ".join(run) + "\n"
                f"killed {net.killed}  rejoined {net.rejoined}  work dir {net.options.work_dir}"
                + self.model_reset_text())

    def model_reset_text(self) -> str:
        """The coordinator's model resets, and those this testnet saw with a holder of the
        newer model alive (what must never happen); "" while none."""
        net = self.testnet
        said = describe_model_resets(net.state.model_resets if net.state else 0)
        lost = describe_model_lost(net.state.model_lost if net.state else False)
        with_holder = net.model_resets.with_holder
        text = f"\n{lost}" if lost else ""
        if said is None and not with_holder:
            return text
        return (text + "\n" + (said or "MODEL RESET seen by the testnet")
                + (f" ({with_holder} with a holder alive)" if with_holder else ""))

    def server_now(self) -> float:
        """The coordinator's unix time now: its time in the last state update, plus the
        time since (this machine's clock when the update did not say)."""
        net = self.testnet
        if net.server_time <= 0:
            return time.time()
        return net.server_time + max(0.0, time.monotonic() - net.state_received)

    async def refresh_view(self) -> None:
        if not self.is_running:  # shutting down: the timer can fire after the widgets went
            return
        self.query_one("#server", Static).update(self.server_text())
        results = await asyncio.gather(*(source.fetch() for source in self._sources.values()),
                                       return_exceptions=True)
        if not self.is_running:  # the app stopped while the clients were asked
            return
        net = self.testnet
        witness = witness_states(net.state, {i: client_key(i) for i in net.clients})
        table = self.query_one("#clients", DataTable)
        table.clear()
        for (i, client), metrics in zip(net.clients.items(), results, strict=True):
            process = client.process
            alive = "running" if process is not None and process.returncode is None else (
                f"exit {process.returncode}" if process is not None else "not started")
            if isinstance(metrics, BaseException):
                table.add_row(str(i), alive, "", "", "", "", "", "", witness[i],
                              _clip(describe_line(client.last_line), STATUS_WIDTH))
                continue
            loss = "" if metrics.loss is None else f"{metrics.loss:.3f}"
            table.add_row(str(i), alive, metrics.phase, str(metrics.epoch), str(metrics.step),
                          loss, f"{metrics.tokens_per_sec:.0f}",
                          str(len(metrics.connected_peers)), witness[i], "metrics ok")
        self.query_one(LossPlot).show(mean_losses(c.losses for c in net.clients.values()))
        self.query_one(LogPane).poll()


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


async def run_testnet_tui(testnet: Testnet) -> None:
    """The TUI until q / ctrl+c / a signal, then stop every process (`testnet.stop_signal`
    tells the exit code: None for q, SIGINT for ctrl+c)."""
    signals = StopSignals()
    app = TestnetApp(testnet)
    stopping = False

    def on_signal(sig: signal.Signals) -> None:
        if stopping or signals.count > 1:  # already stopping: kill what is left at once
            testnet.stopping(sig.name, count=2)
        else:
            app.stop_for(sig.name)

    signals.on_signal(on_signal)
    signals.install()
    try:
        await testnet.start()
        if signals.signal is None:
            await run_app_until_stopped(app, signals, app.stop_for)
    finally:
        stopping = True
        reason = app.stopping or signals.reason
        if reason == "ctrl+c":  # the key of SIGINT: the same exit code
            testnet.stop_signal = signal.SIGINT
        testnet.stopping(reason)
        try:
            await testnet.stop()
        finally:
            signals.remove()
