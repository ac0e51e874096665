"""`--no-tui` output: the panels as log lines, printed when what they say changes."""

from __future__ import annotations

import io

from run_manager.runner import LogLinePrinter
from run_manager.sources import RunSnapshot
from run_manager.view import Dashboard


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
