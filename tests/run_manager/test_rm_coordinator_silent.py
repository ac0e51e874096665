"""A coordinator that dies or hangs mid-run shows in the Run panel (issue 35, item 5): it
used to freeze there on its last state (`RoundTrain 01:00 / 00:10 · clients 1/1 healthy`),
the phase timer running past its limit. A real `psyche-coordinator run` process followed
by the real TcpCoordinatorSource and Monitor, the TUI driven by Pilot: stopped with
SIGSTOP (hung: the connection stays open, no heartbeat comes) and killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_rm_tui import text_of
from textual.pilot import Pilot

from psyche_common.run_view import RunClient, RunSnapshot
from run_manager.coordinator_health import SILENT_AFTER_S
from run_manager.monitor import Monitor, Part
from run_manager.sources import Heard, TcpCoordinatorSource
from run_manager.tui.app import RunManagerApp
from run_manager.view import Dashboard
from tests.run_manager.coordinator_setup import start_coordinator

RUN_ID = "silent-run"
SHOWN_WITHIN_S = 10.0  # the bound: a dead coordinator shows within 10 s


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    process, port = start_coordinator(tmp_path, RUN_ID)
    try:
        yield process, port
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)


async def until(pilot: Pilot[None], check: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until `check()` held (polled between Pilot pauses); fails after timeout_s."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, "not shown in time"
        await pilot.pause(0.1)
    return time.monotonic() - started


async def test_a_hung_then_a_killed_coordinator_shows_in_the_run_panel(
        coordinator: tuple[subprocess.Popen[bytes], int]) -> None:
    process, port = coordinator
    dashboard = Dashboard()
    source = TcpCoordinatorSource(f"127.0.0.1:{port}", RUN_ID, wait_s=60, max_backoff_s=0.5)

    def monitor(on_change: Callable[[Part], None]) -> Monitor:
        return Monitor(dashboard, source, None, on_change)

    app = RunManagerApp(dashboard, monitor_factory=monitor)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            alert = app.query_one("#run-alert")

            def summary() -> str:
                return text_of(app, "#run-summary")

            await until(pilot, lambda: f"run {RUN_ID}: WaitingForMembers" in summary(), 60)
            assert not alert.display
            # Hung: no state, no heartbeat, the connection open.
            os.kill(process.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            await until(pilot, lambda: bool(alert.display), SHOWN_WITHIN_S + 2)
            assert time.monotonic() - stopped <= SHOWN_WITHIN_S
            assert time.monotonic() - stopped >= SILENT_AFTER_S - 5.0  # a heartbeat is 5 s
            line = text_of(app, "#run-alert")
            assert line.startswith("COORDINATOR SILENT ") and line.endswith(
                " s: no state or heartbeat; the run below is its last state"), line
            # It wakes up: its heartbeats (every 5 s) clear the line.
            os.kill(process.pid, signal.SIGCONT)
            await until(pilot, lambda: not alert.display, 10)
            # Killed: the connection closes, the line comes at once and the timer stops.
            process.kill()
            process.wait(10)
            killed = time.monotonic()
            await until(pilot, lambda: bool(alert.display), SHOWN_WITHIN_S)
            assert time.monotonic() - killed < 5.0
            line = text_of(app, "#run-alert")
            assert line.startswith("COORDINATOR SILENT ") and "connection lost" in line, line
            frozen = summary().splitlines()[0]
            await pilot.pause(2.5)
            assert summary().splitlines()[0] == frozen  # the phase timer does not run on
            assert text_of(app, "#run-alert").startswith("COORDINATOR SILENT ")
    finally:
        await source.close()


def stuck(phase: str) -> Dashboard:
    dashboard = Dashboard()
    dashboard.apply_run(RunSnapshot(run_id="r", phase=phase, phase_elapsed_s=60,  # type: ignore[arg-type]  # a RunPhase
                                    phase_timeout_s=10, epoch=1, step=3,
                                    clients=[RunClient(id="aa", state="Healthy")]))
    return dashboard


async def test_a_phase_past_its_limit_is_said_not_only_timed() -> None:
    app = RunManagerApp(stuck("RoundTrain"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert text_of(app, "#run-alert") == (
            "PHASE OVERDUE: RoundTrain 01:00 of 00:10; the coordinator has not moved the "
            "run on")
        assert text_of(app, "#run-summary").splitlines()[0] == "run r: RoundTrain 01:00 / 00:10"
    waiting = RunManagerApp(stuck("WaitingForMembers"))  # waits for clients as long as it takes
    async with waiting.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert not waiting.query_one("#run-alert").display


async def test_silence_and_an_unreachable_coordinator_are_said_with_their_reason() -> None:
    dashboard = stuck("Cooldown")
    dashboard.coordinator_heard = Heard(time.monotonic() - 45, False, "the coordinator "
                                        "closed the connection")
    dashboard.coordinator_error = "run 'r' on Solana: no endpoint answered"
    app = RunManagerApp(dashboard)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert text_of(app, "#run-alert").splitlines() == [
            "COORDINATOR UNREACHABLE: run 'r' on Solana: no endpoint answered",
            "COORDINATOR SILENT 45 s: connection lost (the coordinator closed the "
            "connection); the run below is its last state",
            "PHASE OVERDUE: Cooldown 01:00 of 00:10; the coordinator has not moved the run on"]
        dashboard.coordinator_heard = Heard(time.monotonic() - 3, True)  # a heartbeat 3 s ago
        dashboard.coordinator_error = ""
        dashboard.apply_run(None)
        app.refresh_panels("run")
        await pilot.pause()
        assert not app.query_one("#run-alert").display
