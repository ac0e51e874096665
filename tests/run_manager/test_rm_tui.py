"""Pilot tests of every panel, and SVG snapshots of the main screens.

The panels are driven with typed snapshots built here (data, not mocks): a run in
RoundTrain with three clients, the client's metrics over a few steps, the container's
events as the supervisor reports them.
"""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable, ProgressBar, RichLog, Static

from psyche_common.metrics_schema import ClientMetrics
from psyche_common.run_view import RunClient, RunSnapshot, WitnessProgress
from psyche_common.ui.training_panel import TrainingPanel
from run_manager.docker_supervisor import (
    ContainerExited,
    ContainerStarted,
    LogLine,
    RestartScheduled,
)
from run_manager.tui.app import RunManagerApp
from run_manager.tui.messages import DashboardChanged, SupervisorEventPosted
from run_manager.tui.widgets.log_screen import LogScreen
from run_manager.view import Dashboard

ALICE = "7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU"
BOB = "9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM"
CAROL = "HN7cABqLq46Es1jh92dQQisAq662SmxELLLsHHe4YWrH"


def sample_dashboard() -> Dashboard:
    dashboard = Dashboard()
    dashboard.wallet.address = ALICE
    dashboard.wallet.balance_lamports = 1_500_000_000
    dashboard.apply_run(RunSnapshot(
        run_id="llama2-20m", phase="RoundTrain", phase_elapsed_s=12, phase_timeout_s=30,
        epoch=2, step=41, client_version="0.1.0",
        clients=[RunClient(id=ALICE, points=120), RunClient(id=BOB, points=80),
                 RunClient(id=CAROL, state="Dropped")],
        witnesses=WitnessProgress(elected=[ALICE, BOB], received=[ALICE], quorum=2),
    ))  # fmt: skip
    for step, loss in [(38, 4.1), (39, 3.7), (40, 3.4), (41, 3.2)]:
        dashboard.apply_metrics(ClientMetrics(
            phase="RoundTrain", epoch=2, step=step, loss=loss, tokens_per_sec=812.5,
            role="Witness", last_result_sizes=[40960, 38912],
        ))  # fmt: skip
    for event in (
        ContainerStarted("c0ffee", "psyche-client:0.1.0", "0.1.0", 0),
        LogLine("joined run llama2-20m"),
        ContainerExited(3, 4.0),
        RestartScheduled("crash", 5.0, 1),
        ContainerStarted("c0ffee2", "psyche-client:0.1.0", "0.1.0", 1),
        LogLine("step 41 loss 3.2"),
    ):
        dashboard.apply_event(event)
    return dashboard


def text_of(app: RunManagerApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


async def test_run_panel_shows_phase_timer_epoch_step_and_clients() -> None:
    app = RunManagerApp(sample_dashboard())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        summary = text_of(app, "#run-summary")
        assert "RoundTrain 00:12 / 00:30" in summary
        assert "epoch 2  step 41  clients 2/3 healthy" in summary
        table = app.query_one("#run-clients", DataTable)
        assert table.row_count == 3
        assert table.get_row(CAROL)[1] == "Dropped"
        assert table.get_row(ALICE)[2] == "120"


async def test_run_panel_says_what_the_run_waits_for() -> None:
    """WaitingForMembers: the clients wanted and connected; Warmup: those ready; Paused
    and Finished in words; a round: no waiting line."""
    dashboard = Dashboard()
    app = RunManagerApp(dashboard)
    waiting = RunSnapshot(run_id="llama2-20m", phase="WaitingForMembers", phase_timeout_s=30,
                          init_min_clients=3, joined=2)
    warmup = RunSnapshot(run_id="llama2-20m", phase="Warmup", phase_elapsed_s=4, phase_timeout_s=60,
                         init_min_clients=3, joined=3, clients=[RunClient(id=ALICE), RunClient(id=BOB)],
                         witnesses=WitnessProgress(received=[BOB], quorum=2, target=2))
    expected = [
        (waiting, "waiting for 3 clients, 2 connected"),
        (waiting.model_copy(update={"joined": None}), "waiting for 3 clients"),
        (warmup, "warming up: 1 of 2 ready"),
        (RunSnapshot(run_id="llama2-20m", phase="Paused"), "paused: nothing trains until the run is resumed"),
        (RunSnapshot(run_id="llama2-20m", phase="Finished"), "finished: the run is over"),
    ]  # fmt: skip
    async with app.run_test(size=(120, 40)) as pilot:
        for snapshot, line in expected:
            dashboard.apply_run(snapshot)
            app.post_message(DashboardChanged("run"))
            await pilot.pause()
            assert text_of(app, "#run-summary").splitlines()[-1] == line
        dashboard.apply_run(sample_dashboard().run)
        app.post_message(DashboardChanged("run"))
        await pilot.pause()
        assert text_of(app, "#run-summary").splitlines()[-1].startswith("epoch 2  step 41")


async def test_witness_panel_shows_quorum_progress() -> None:
    app = RunManagerApp(sample_dashboard())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "witnesses 1/2 sent, quorum 1/2 (50%)" in text_of(app, "#witness-summary")
        bar = app.query_one("#witness-quorum", ProgressBar)
        assert (bar.progress, bar.total) == (1, 2)
        members = text_of(app, "#witness-members")
        assert f"✔ {ALICE}" in members and f"… {BOB}" in members


async def test_training_panel_plots_the_loss_and_shows_throughput() -> None:
    dashboard = sample_dashboard()
    app = RunManagerApp(dashboard)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        summary = text_of(app, "#training-summary")
        assert "loss 3.2000  812 tok/s" in summary
        assert "last results: 40.0 KiB, 38.0 KiB" in summary
        assert list(dashboard.losses) == [(38, 4.1), (39, 3.7), (40, 3.4), (41, 3.2)]
        # A new step arrives through the monitor's message: the plot gets one more point.
        dashboard.apply_metrics(ClientMetrics(step=42, loss=3.0, tokens_per_sec=900))
        app.post_message(DashboardChanged("training"))
        await pilot.pause()
        assert "loss 3.0000  900 tok/s" in text_of(app, "#training-summary")
        assert app.query_one(TrainingPanel).plot.plt is not None
        assert len(dashboard.losses) == 5


async def test_container_panel_follows_supervisor_events_and_tails_the_log() -> None:
    app = RunManagerApp(sample_dashboard())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        summary = text_of(app, "#container-summary")
        assert "container psyche-client:0.1.0: running" in summary
        assert "restarts 1 (crashes in a row 1)" in summary
        app.post_message(SupervisorEventPosted(LogLine("step 42 loss 3.0")))
        app.post_message(SupervisorEventPosted(ContainerExited(10, 60.0)))
        await pilot.pause()
        assert "exited (10)" in text_of(app, "#container-summary")
        tail = [line.text for line in app.query_one("#container-tail", RichLog).lines]
        assert tail == ["joined run llama2-20m", "step 41 loss 3.2", "step 42 loss 3.0"]


async def test_wallet_panel_shows_address_balance_and_points() -> None:
    app = RunManagerApp(sample_dashboard())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        text = str(app.query_one("#wallet", Static).render())
        assert ALICE in text and "1.500000000 SOL" in text and "points 120" in text


async def test_keys_l_shows_full_screen_logs_and_q_quits() -> None:
    app = RunManagerApp(sample_dashboard())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        assert isinstance(app.screen, LogScreen)
        lines = [line.text for line in app.screen.query_one("#full-log", RichLog).lines]
        assert lines == ["joined run llama2-20m", "step 41 loss 3.2"]
        await pilot.press("escape")
        assert not isinstance(app.screen, LogScreen)
        await pilot.press("r")  # no supervisor in this app: it says so rather than failing
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0 and not app.is_running


async def test_a_change_arriving_while_the_app_shuts_down_is_not_drawn() -> None:
    """The monitor and the wallet timer can deliver a change after the panels are gone
    (CI saw NoMatches for RunPanel during shutdown): it is dropped, not raised."""
    app = RunManagerApp(sample_dashboard())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
    assert not app.is_running and not app.query(Static)  # the panels are gone
    app.refresh_panels()  # as a late DashboardChanged or the wallet timer would
    app.refresh_panels("run")


def test_snapshot_main_screen(snap_compare: Any) -> None:
    assert snap_compare(RunManagerApp(sample_dashboard()), terminal_size=(120, 40))


def test_snapshot_empty_dashboard(snap_compare: Any) -> None:
    assert snap_compare(RunManagerApp(Dashboard()), terminal_size=(120, 40))


def test_snapshot_full_screen_logs(snap_compare: Any) -> None:
    assert snap_compare(RunManagerApp(sample_dashboard()), press=["l"], terminal_size=(120, 40))


async def test_ctrl_c_stops_like_q_instead_of_asking_for_ctrl_q() -> None:
    app = RunManagerApp(sample_dashboard())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.stop_requests == 1 and app.return_code == 0 and not app.is_running
