"""The run-manager's Training panel follows the run to Finished (the client has exited:
its last metrics are the final ones, not a client gone quiet), and the client's HTTP
request lines stay out of the event pane (the full-screen log keeps them). The client
itself no longer logs them: the run-manager's filter is for clients that still do."""

from __future__ import annotations

import io
import logging
from typing import Any

import httpx
from loopback import free_port
from textual.widgets import RichLog, Static

from client_image.runtime.observability import MetricsServer, configure_logging
from psyche_common.metrics_schema import ClientMetrics
from run_manager.docker_supervisor import LogLine
from run_manager.runner import LogLinePrinter
from run_manager.tui.app import RunManagerApp
from run_manager.tui.messages import DashboardChanged, SupervisorEventPosted
from run_manager.tui.widgets.log_screen import LogScreen
from run_manager.view import Dashboard, is_http_request_line
from tests.run_manager.test_rm_tui import sample_dashboard

HTTP_LINE = ('2026-11-26 04:50:00,123 INFO httpx: HTTP Request: POST http://127.0.0.1:8899 '
             '"HTTP/1.1 200 OK"')
HTTP_JSON_LINE = ('{"level": "INFO", "logger": "httpx", "message": "HTTP Request: GET '
                  'http://127.0.0.1:6269/ \\"HTTP/1.1 200 OK\\""}')


def finished_dashboard() -> Dashboard:
    """The sample run, played to its end: the client's last metrics (step 41, loss 3.2)
    stay, its endpoint is gone."""
    dashboard = sample_dashboard()
    assert dashboard.run is not None
    dashboard.apply_run(dashboard.run.model_copy(update={
        "phase": "Finished", "step": 42, "phase_timeout_s": None, "phase_elapsed_s": 3.0}))
    dashboard.metrics_error = "client metrics at http://127.0.0.1:6269/: connection refused"
    return dashboard


async def test_the_training_panel_follows_the_run_to_finished() -> None:
    dashboard = sample_dashboard()
    app = RunManagerApp(dashboard)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        summary = app.query_one("#training-summary", Static)
        assert "training: RoundTrain epoch 2 step 41" in str(summary.render())
        finished = finished_dashboard()
        dashboard.apply_run(finished.run)
        dashboard.metrics_error = finished.metrics_error
        app.post_message(DashboardChanged("run"))  # the run's poll alone moves it
        await pilot.pause()
        text = str(summary.render())
        assert text == "training: finished: the run ended at step 42, final loss 3.2000"


def test_no_tui_prints_the_finished_training_line() -> None:
    out = io.StringIO()
    printer = LogLinePrinter(finished_dashboard(), out)
    printer.on_change("run")
    assert "[training] training: finished: the run ended at step 42, final loss 3.2000" in \
        out.getvalue().splitlines()


def test_snapshot_finished_run(snap_compare: Any) -> None:
    assert snap_compare(RunManagerApp(finished_dashboard()), terminal_size=(120, 40))


async def test_http_request_lines_stay_out_of_the_event_pane_but_not_the_full_log() -> None:
    app = RunManagerApp(sample_dashboard())
    async with app.run_test(size=(120, 40)) as pilot:
        for text in (HTTP_LINE, "step 42 loss 3.0", HTTP_JSON_LINE):
            app.post_message(SupervisorEventPosted(LogLine(text)))
        await pilot.pause()
        tail = [line.text for line in app.query_one("#container-tail", RichLog).lines]
        assert tail == ["joined run llama2-20m", "step 41 loss 3.2", "step 42 loss 3.0"]
        await pilot.press("l")
        await pilot.pause()
        assert isinstance(app.screen, LogScreen)
        full = [line.text for line in app.screen.query_one("#full-log", RichLog).lines]
        assert HTTP_LINE in full and "step 42 loss 3.0" in full


def test_what_counts_as_an_http_request_line() -> None:
    assert is_http_request_line(HTTP_LINE) and is_http_request_line(HTTP_JSON_LINE)
    assert not is_http_request_line("step 42 loss 3.0")
    assert not is_http_request_line("warning: HTTP Request failed, retrying")


async def test_the_client_does_not_log_its_http_requests(capfd: Any) -> None:
    """A real request through httpx to the client's own metrics endpoint, with the client's
    console logging: the request is not a log line, a warning still is."""
    previous = logging.getLogger().handlers[:], logging.getLogger().level
    port = free_port()
    server = MetricsServer(port, ClientMetrics)
    await server.start()
    try:
        configure_logging("console")
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/")).status_code == 200
        logging.getLogger("httpx").warning("a warning still shows")
    finally:
        await server.stop()
        logging.getLogger().handlers[:], level = previous
        logging.getLogger().setLevel(level)
    err = capfd.readouterr().err
    assert "HTTP Request" not in err
    assert "a warning still shows" in err
