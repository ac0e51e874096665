"""The server TUI under Textual's Pilot: it shows the live run and Ctrl+P pauses/resumes."""

from __future__ import annotations

import asyncio

from tcp_helpers import Clock, identity, join, make_state_file, next_state, server_options
from textual.widgets import DataTable, Static

from coordinator import Coordinator, NodeIdentity, RunState
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.server import CoordinatorServer
from coordinator_tcp.summary import phase_timer, summarize
from coordinator_tcp.tui import CoordinatorApp
from psyche_common.run_view import phase_elapsed


def on_screen(app: CoordinatorApp) -> str:
    """The status panel as drawn (not the text the app would draw)."""
    return str(app.query_one("#status", Static).render())


async def test_dashboard_shows_run_and_ctrl_p_pauses() -> None:
    clock = Clock(3_000_000.0)
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file()), server_options(),
                               clock=clock)
    await server.start()
    observer: ProtocolConnection | None = None
    client: ProtocolConnection | None = None
    try:
        observer = await join(server, identity(9), observe=True)
        await next_state(observer)
        app = CoordinatorApp(server)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.1)
            status = app.status_text()
            assert "run local-testnet" in status and "phase WaitingForMembers" in status
            assert "connected 0" in status and "quorum" in status
            # A run fresh from its state.toml has no phase start: no Unix time as a timer.
            assert "phase WaitingForMembers — / 1s" in on_screen(app)
            assert "waiting for 1 client, 0 connected" in on_screen(app)
            await pilot.press("ctrl+p")
            await pilot.pause(0.1)
            assert server.state.run_state is RunState.Paused
            assert "pause: ok" in app.status_text() and "phase Paused" in app.status_text()
            assert "paused: nothing trains until the run is resumed" in on_screen(app)
            paused = await next_state(observer)  # the pause was broadcast
            assert paused.state_bytes != b""
            await pilot.press("ctrl+p")
            await pilot.pause(0.1)
            assert server.state.run_state is RunState.WaitingForMembers
            assert "resume: ok" in app.status_text()
            client = await join(server, identity(1))
            clock.now += 2
            for _ in range(100):  # the client is listed once the epoch starts
                if server.state.run_state is RunState.Warmup:
                    break
                await asyncio.sleep(0.05)
            await pilot.pause(0.7)
            table = app.query_one("#clients", DataTable)
            assert table.row_count == 1
            assert "phase Warmup 0s / 2s" in app.status_text()
            assert "connected 1" in app.status_text()
            assert "warming up: 0 of 1 ready" in on_screen(app)
            assert "waiting for" not in on_screen(app)
    finally:
        for connection in (observer, client):
            if connection is not None:
                await connection.close()
        await server.stop()


async def test_the_status_says_how_many_clients_the_run_waits_for() -> None:
    """init_min_clients 2, one client connected: the status says both, on screen."""
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file(init_min_clients=2)),
                               server_options(), clock=Clock(3_000_000.0))
    await server.start()
    client: ProtocolConnection | None = None
    try:
        app = CoordinatorApp(server)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.1)
            assert "waiting for 2 clients, 0 connected" in on_screen(app)
            client = await join(server, identity(1))
            await pilot.pause(0.7)  # the next refresh
            assert "waiting for 2 clients, 1 connected" in on_screen(app)
            assert server.state.run_state is RunState.WaitingForMembers
    finally:
        if client is not None:
            await client.close()
        await server.stop()


def test_summary_reports_phase_timer_and_quorum() -> None:
    coordinator = Coordinator.from_state_file(make_state_file())
    state = coordinator.state
    summary = summarize(state, state.run_state_start_unix_timestamp + 3)
    assert summary.phase == "WaitingForMembers" and summary.phase_elapsed_s is None  # no start yet
    assert summary.phase_timer == "— / 1s" and summary.witness_target == 1 == summary.quorum and summary.clients == []
    assert summary.waiting == "waiting for 1 client"  # how many are connected: not given
    assert summarize(state, 1_000, joined=3).waiting == "waiting for 1 client, 3 connected: starting"
    coordinator.tick([NodeIdentity(b"\x01" * 32)], now=1_795_430_000, seed=1)
    warmup = summarize(coordinator.state, 1_795_430_003)
    assert warmup.phase == "Warmup" and warmup.phase_timer == "3s / 2s"
    assert warmup.waiting == "warming up: 0 of 1 ready"


def test_phase_timer_never_shows_a_unix_time() -> None:
    assert phase_timer(3, 20) == "3s / 20s" and phase_timer(3, None) == "3s"
    assert phase_timer(None, 2) == "— / 2s" and phase_timer(None, None) == "—"
    now = 1_795_430_322
    assert phase_elapsed(now - 3, now) == 3
    assert phase_elapsed(0, now) is None  # no phase start (a fresh state.toml)
    assert phase_elapsed(1_000, now) is None  # a start on another clock: years, not a phase
    assert phase_elapsed(now, 0) is None  # no clock
    assert phase_elapsed(now + 5, now) == 0  # the clock is a little behind the start
    # The testnet's case: a state from its state.toml at the coordinator's unix time.
    state = Coordinator.from_state_file(make_state_file()).state
    assert summarize(state, now).phase_timer == "— / 1s"
