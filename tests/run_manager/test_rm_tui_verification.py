"""The run-manager's Verification panel (Pilot and SVG snapshots), its `--no-tui` lines and
the alert when the coordinator ejected this operator's client.

Same typed data as test_rm_tui.py's sample run, plus the epoch's verification (reports,
ejections: from the coordinator state, psyche_common.run_view) and the client's
verification counters (from its metrics endpoint).
"""

from __future__ import annotations

import io
from typing import Any

from test_rm_tui import ALICE, BOB, CAROL, sample_dashboard, text_of

from psyche_common.metrics_schema import ClientMetrics
from psyche_common.run_view import RunReport, RunVerification
from run_manager.runner import LogLinePrinter
from run_manager.tui.app import RunManagerApp
from run_manager.tui.messages import DashboardChanged
from run_manager.tui.widgets import VerificationPanel
from run_manager.view import Dashboard, describe_verification, ejection_alert
from tests.run_manager.tui_setup import eject


def metrics(**verification: Any) -> ClientMetrics:
    return ClientMetrics(phase="RoundTrain", epoch=2, step=41, loss=3.2, tokens_per_sec=812.5,
                         role="Witness", last_result_sizes=[40960, 38912], **verification)


def verifying(dashboard: Dashboard | None = None) -> Dashboard:
    """Alice's client follows one trainer and reported Carol, whom Bob reported too."""
    dashboard = dashboard or sample_dashboard()
    eject(dashboard, CAROL, [
        RunReport(reporter=ALICE, accused=CAROL, step=40, jaccard=0.31, hamming=0.48,
                  manhattan=1.2),
        RunReport(reporter=BOB, accused=CAROL, step=40, jaccard=0.3, hamming=0.5,
                  manhattan=1.1)])
    dashboard.apply_metrics(metrics(verification_following=1, verifications_passed=3,
                                    verifications_failed=1, verification_reports_sent=1))
    return dashboard


def ejected() -> Dashboard:
    """Alice's own client was ejected by Bob and Carol, its followers."""
    dashboard = sample_dashboard()
    eject(dashboard, ALICE, [
        RunReport(reporter=CAROL, accused=ALICE, step=41, jaccard=0.2, hamming=0.4,
                  manhattan=0.9),
        RunReport(reporter=BOB, accused=ALICE, step=40, jaccard=0.31, hamming=0.48,
                  manhattan=1.2)])
    dashboard.apply_metrics(metrics(verifications_passed=3, ejected=True, ejected_epoch=2,
                                    ejected_by=[BOB, CAROL]))
    return dashboard


def test_describe_verification_lines() -> None:
    dashboard = verifying()
    assert describe_verification(dashboard.run, dashboard.metrics) == [
        "run: verification 50%  2 reports this epoch  1 ejected",
        "this client: following 1 trainer · 3 passed · 1 failed · 1 report sent",
    ]
    assert ejection_alert(dashboard.run, dashboard.metrics) is None
    assert describe_verification(sample_dashboard().run, sample_dashboard().metrics) == []
    assert describe_verification(None, None) == []


def test_the_ejection_alert_says_by_whom_and_why() -> None:
    dashboard = ejected()
    alert = ejection_alert(dashboard.run, dashboard.metrics)
    assert alert == (
        "EJECTED in epoch 2 by 2 followers (9WzDXw…YtAWWM, HN7cAB…e4YWrH): their replays "
        "of steps 40, 41 differ (jaccard 0.310, hamming 0.480, manhattan 1.200)")
    # a later epoch: the coordinator no longer holds the reports, the alert still says who
    assert dashboard.run is not None
    later = dashboard.run.model_copy(update={"epoch": 3, "verification": RunVerification()})
    assert ejection_alert(later, dashboard.metrics) == (
        "EJECTED in epoch 2 by 2 followers (9WzDXw…YtAWWM, HN7cAB…e4YWrH): their replays "
        "did not reproduce this client's results")
    assert describe_verification(later, dashboard.metrics)[-1] == ejection_alert(
        later, dashboard.metrics)


async def test_the_panel_is_hidden_until_the_run_verifies() -> None:
    dashboard = sample_dashboard()
    app = RunManagerApp(dashboard)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        panel = app.query_one(VerificationPanel)
        assert not panel.display
        verifying(dashboard)
        app.post_message(DashboardChanged("training"))
        await pilot.pause()
        assert panel.display and not panel.has_class("-ejected")
        text = text_of(app, "#verification")
        assert "run: verification 50%  2 reports this epoch  1 ejected" in text
        assert "following 1 trainer · 3 passed · 1 failed · 1 report sent" in text
        assert not app._notifications


async def test_an_ejection_is_an_alert_and_a_notification_once() -> None:
    dashboard = verifying()
    app = RunManagerApp(dashboard)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert not app._notifications
        ejection = ejected()
        dashboard.apply_run(ejection.run)
        dashboard.apply_metrics(ejection.metrics or ClientMetrics())
        app.post_message(DashboardChanged("training"))
        await pilot.pause()
        panel = app.query_one(VerificationPanel)
        assert panel.has_class("-ejected")
        assert "EJECTED in epoch 2 by 2 followers" in text_of(app, "#verification")
        notes = list(app._notifications)
        assert len(notes) == 1 and notes[0].severity == "error"
        assert notes[0].title == "client ejected" and "steps 40, 41 differ" in notes[0].message
        app.post_message(DashboardChanged("run"))  # the next polls do not notify again
        app.post_message(DashboardChanged("training"))
        await pilot.pause()
        assert len(list(app._notifications)) == 1


def test_no_tui_prints_verification_lines_when_they_change() -> None:
    dashboard = sample_dashboard()
    out = io.StringIO()
    printer = LogLinePrinter(dashboard, out)
    printer.on_change("training")
    assert "[verification]" not in out.getvalue()
    verifying(dashboard)
    printer.on_change("run")
    printer.on_change("training")  # same lines: printed once
    lines = [line for line in out.getvalue().splitlines() if line.startswith("[verification]")]
    assert lines == [
        "[verification] run: verification 50%  2 reports this epoch  1 ejected",
        "[verification] this client: following 1 trainer · 3 passed · 1 failed · 1 report sent",
    ]
    ejection = ejected()
    dashboard.apply_run(ejection.run)
    dashboard.apply_metrics(ejection.metrics or ClientMetrics())
    printer.on_change("training")
    assert out.getvalue().splitlines()[-1].startswith("[verification] EJECTED in epoch 2 by 2")


def test_snapshot_verifying(snap_compare: Any) -> None:
    assert snap_compare(RunManagerApp(verifying()), terminal_size=(120, 40))


def test_snapshot_ejected(snap_compare: Any) -> None:
    assert snap_compare(RunManagerApp(ejected()), terminal_size=(120, 40))
