"""`psyche-client train --logs tui`: the client's TUI, driven by Textual's Pilot, over a
real in-process coordinator server and a real client (iroh endpoint on loopback)."""

from __future__ import annotations

import asyncio

from textual.widgets import RichLog

from client_image.client_config import ClientConfig
from client_image.p2p import NodeConfig
from client_image.runtime.client import ClientOptions, PsycheClient
from client_image.runtime.observability import EventLog
from client_image.runtime.tui import ClientApp
from coordinator import Coordinator, load_state_file
from coordinator_tcp.server import CoordinatorServer
from coordinator_tcp.server_options import ServerOptions
from psyche_common.identity import Identity
from psyche_common.ui.run_panel import RunPanel

STATE = "config/local-testnet/state.toml"  # init_min_clients = 3: one client waits


async def test_client_tui_shows_the_run_and_events_and_q_stops_the_client() -> None:
    server = CoordinatorServer(Coordinator.from_state_file(load_state_file(STATE)),
                               ServerOptions(host="127.0.0.1", port=0, tick_interval_s=0.1))
    await server.start()
    identity = Identity.generate()
    config = ClientConfig.of(run_id="local-testnet", server_addr=f"127.0.0.1:{server.port}",
                             device="cpu")
    client = PsycheClient(ClientOptions(config, identity=identity,
                                        node_config=NodeConfig.loopback()),
                          EventLog("tui"))
    app = ClientApp(client, refresh_s=0.1)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            for _ in range(100):
                await pilot.pause(0.1)
                if client.state is not None and app.dashboard.run is not None:
                    break
            summary = str(app.query_one("#run-summary").render())
            assert "run local-testnet: WaitingForMembers" in summary, summary
            events = "\n".join(line.text for line in app.query_one("#client-events", RichLog).lines)
            assert "started" in events and identity.node_id in events, events
            assert app.query_one(RunPanel) is not None
            assert identity.public_key in [node.key for node in server.pending]
            await pilot.press("q")
            for _ in range(100):
                if client.stop_event.is_set() and not app.is_running:
                    break
                await pilot.pause(0.1)
        assert client.stop_event.is_set()
        assert app.return_value == 0
    finally:
        await asyncio.wait_for(server.stop(), 10)
