"""The `psyche-testnet --tui` screen: the coordinator's state and every client's metrics.

The server part comes from the testnet's observer connection; each client row from its
metrics endpoint (http://127.0.0.1:6269+i, `run_manager.sources.ClientMetrics`), polled
every second, with the process status and the last log line when the endpoint is down.
`q` stops the testnet (every process it started).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Header, Static

from coordinator_tcp.summary import summarize
from psyche_common.metrics_source import HttpClientMetricsSource

if TYPE_CHECKING:
    from local_testnet.testnet import Testnet


class TestnetApp(App[None]):
    __test__ = False  # not a pytest test class, despite the name

    TITLE = "psyche testnet"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "stop the testnet")]
    CSS = "#server { height: auto; padding: 0 1; border: round $accent; }"

    def __init__(self, testnet: Testnet):
        super().__init__()
        self.testnet = testnet
        self._sources: dict[int, HttpClientMetricsSource] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("waiting for the coordinator…", id="server")
        yield DataTable(id="clients")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one("#clients", DataTable).add_columns(
            "client", "process", "phase", "epoch", "step", "loss", "tok/s", "peers", "status")
        base = self.testnet.options.metrics_base_port
        self._sources = {i: HttpClientMetricsSource(base + i, timeout_s=0.5)
                         for i in self.testnet.clients}
        self.set_interval(1.0, self.refresh_view)

    async def on_unmount(self) -> None:
        for source in self._sources.values():
            await source.close()

    def server_text(self) -> str:
        net = self.testnet
        if net.state is None:
            return "waiting for the coordinator…"
        s = summarize(net.state, int(time.time()))
        return (f"run {s.run_id}  phase {s.phase} {s.phase_timer}  epoch {s.epoch}  "
                f"step {s.step}/{s.total_steps}  clients {len(s.clients)}  "
                f"witnesses {s.witnesses}/{s.witness_target} (quorum {s.quorum})\n"
                f"killed {net.killed}  rejoined {net.rejoined}  work dir {net.options.work_dir}")

    async def refresh_view(self) -> None:
        self.query_one("#server", Static).update(self.server_text())
        results = await asyncio.gather(*(source.fetch() for source in self._sources.values()),
                                       return_exceptions=True)
        table = self.query_one("#clients", DataTable)
        table.clear()
        for (i, client), metrics in zip(self.testnet.clients.items(), results, strict=True):
            process = client.process
            alive = "running" if process is not None and process.returncode is None else (
                f"exit {process.returncode}" if process is not None else "not started")
            if isinstance(metrics, BaseException):
                table.add_row(str(i), alive, "", "", "", "", "", "", client.last_line[-60:])
                continue
            loss = "" if metrics.loss is None else f"{metrics.loss:.3f}"
            table.add_row(str(i), alive, metrics.phase, str(metrics.epoch), str(metrics.step),
                          loss, f"{metrics.tokens_per_sec:.0f}",
                          str(len(metrics.connected_peers)), "metrics ok")


async def run_testnet_tui(testnet: Testnet) -> None:
    try:
        await testnet.start()
        await TestnetApp(testnet).run_async()
    finally:
        await testnet.stop()
