"""`--no-tui` output: the panels as log lines, printed when what they say changes."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

from run_manager.monitor import Monitor
from run_manager.runner import LogLinePrinter
from run_manager.sources import Heard, RunSnapshot, TcpCoordinatorSource
from run_manager.view import Dashboard
from tests.run_manager.coordinator_setup import start_coordinator


def test_run_lines_print_on_changes_not_on_every_tick_of_the_phase_timer() -> None:
    dashboard, out = Dashboard(), io.StringIO()
    printer = LogLinePrinter(dashboard, out)
    for elapsed, step in ((1.0, 5), (2.0, 5), (3.0, 5), (0.0, 6)):
        dashboard.apply_run(RunSnapshot(run_id="r", phase="RoundTrain", phase_elapsed_s=elapsed,
                                        phase_timeout_s=10, step=step))  # fmt: skip
        printer.on_change("run")
    run_lines = [line for line in out.getvalue().splitlines() if line.startswith("[run]")]
    assert run_lines == [
        "[run] run r: RoundTrain 00:01 / 00:10",
        "[run] epoch 0  step 5  clients 0/0 healthy",
        "[run] run r: RoundTrain 00:00 / 00:10",
        "[run] epoch 0  step 6  clients 0/0 healthy",
    ]


def alarm_lines(out: io.StringIO) -> list[str]:
    return [line for line in out.getvalue().splitlines() if line.startswith(
        ("[run] COORDINATOR ", "[run] PHASE OVERDUE", "[run] coordinator heard again"))]


def test_coordinator_alarms_print_once_when_they_start_and_once_when_they_end() -> None:
    """The TUI's red line over the Run panel, as `--no-tui` prints it (issue 35, item 5):
    once when an alarm starts, not on every poll as its seconds go up, and once when the
    coordinator is heard again."""
    dashboard, out = Dashboard(), io.StringIO()
    printer = LogLinePrinter(dashboard, out)
    dashboard.apply_run(RunSnapshot(run_id="r", phase="RoundTrain", phase_elapsed_s=3,
                                    phase_timeout_s=10, step=5))  # fmt: skip
    dashboard.coordinator_heard = Heard(time.monotonic(), True)
    printer.on_change("run")
    assert alarm_lines(out) == []
    for quiet_s in (9, 10, 11):  # hung: the connection open, no heartbeat
        dashboard.coordinator_heard = Heard(time.monotonic() - quiet_s, True)
        printer.on_change("run")
    assert alarm_lines(out) == [
        "[run] COORDINATOR SILENT 9 s: no state or heartbeat; the run below is its last state"]
    dashboard.coordinator_heard = Heard(time.monotonic() - 12, False, "connection reset")
    printer.on_change("run")  # a new reason is said
    dashboard.apply_run(RunSnapshot(run_id="r", phase="RoundTrain", phase_elapsed_s=20,
                                    phase_timeout_s=10, step=5))  # fmt: skip
    printer.on_change("run")  # a second alarm joins; the first is not repeated
    printer.on_change("run")
    assert alarm_lines(out)[1:] == [
        "[run] COORDINATOR SILENT 12 s: connection lost (connection reset); the run below is "
        "its last state",
        "[run] PHASE OVERDUE: RoundTrain 00:20 of 00:10; the coordinator has not moved the "
        "run on"]
    dashboard.coordinator_heard = Heard(time.monotonic(), True)
    dashboard.apply_run(RunSnapshot(run_id="r", phase="RoundWitness", phase_elapsed_s=0,
                                    phase_timeout_s=10, step=5))  # fmt: skip
    printer.on_change("run")
    printer.on_change("run")
    assert alarm_lines(out)[3:] == [
        "[run] coordinator heard again and keeping to its phases: the alarms above are over"]


async def test_a_killed_coordinator_is_said_by_the_headless_run_manager(tmp_path: Path) -> None:
    """A real `psyche-coordinator run` followed by the real source and Monitor, printed by
    `--no-tui`'s printer: killed, it is said within the TUI's bound (10 s)."""
    process, port = start_coordinator(tmp_path, "headless-run")
    dashboard, out = Dashboard(), io.StringIO()
    printer = LogLinePrinter(dashboard, out)
    source = TcpCoordinatorSource(f"127.0.0.1:{port}", "headless-run", wait_s=60,
                                  max_backoff_s=0.5)
    monitor = Monitor(dashboard, source, None, printer.on_change, interval_s=0.2)
    try:
        started = time.monotonic()
        while "[run] run headless-run: WaitingForMembers" not in out.getvalue():
            assert time.monotonic() - started < 60, out.getvalue()
            await monitor.poll_once()
            await asyncio.sleep(0.2)
        assert alarm_lines(out) == []
        process.kill()
        process.wait(10)
        killed = time.monotonic()
        while not alarm_lines(out):
            assert time.monotonic() - killed < 10, out.getvalue()
            await monitor.poll_once()
            await asyncio.sleep(0.2)
        for _ in range(10):  # it goes on: still one line
            await monitor.poll_once()
        lines = alarm_lines(out)
        assert len(lines) == 1 and lines[0].startswith("[run] COORDINATOR SILENT "), lines
        assert "connection lost" in lines[0], lines
    finally:
        await source.close()
        if process.poll() is None:
            process.kill()
            process.wait(10)
