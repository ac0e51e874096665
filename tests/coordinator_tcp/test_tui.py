"""The server TUI under Textual's Pilot: it shows the live run and Ctrl+P pauses/resumes."""

from __future__ import annotations

import asyncio

from tcp_helpers import Clock, identity, join, make_state_file, next_state, server_options
from textual.widgets import DataTable

from coordinator import Coordinator, RunState
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.server import CoordinatorServer
from coordinator_tcp.summary import summarize
from coordinator_tcp.tui import CoordinatorApp


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
            await pilot.press("ctrl+p")
            await pilot.pause(0.1)
            assert server.state.run_state is RunState.Paused
            assert "pause: ok" in app.status_text() and "phase Paused" in app.status_text()
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
    finally:
        for connection in (observer, client):
            if connection is not None:
                await connection.close()
        await server.stop()


def test_summary_reports_phase_timer_and_quorum() -> None:
    state = Coordinator.from_state_file(make_state_file()).state
    summary = summarize(state, state.run_state_start_unix_timestamp + 3)
    assert summary.phase == "WaitingForMembers" and summary.phase_elapsed_s == 3
    assert summary.phase_timer == "3s / 1s" and summary.witness_target == 1 == summary.quorum and summary.clients == []
