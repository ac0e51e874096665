"""`psyche-testnet replay`: a run shown again from the event files of a real coordinator
server (its recorder attached, real clients joining over TCP) and of clients' real event
logs (client_image/runtime/event_recording.py). The TUI is driven with Textual's Pilot."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tcp_helpers import RUN_ID, identity, join, make_state_file, server_options

from client_image.runtime.event_recording import ClientEventRecorder
from client_image.runtime.events import RunFinished, StateChanged, Trained
from client_image.runtime.observability import EventLog
from coordinator import Coordinator, RunState
from coordinator_tcp import protocol as wire
from coordinator_tcp.event_recording import CoordinatorEventRecorder
from coordinator_tcp.server import CoordinatorServer
from local_testnet.replay import Playback, RunReplay
from local_testnet.replay_tui import ReplayApp
from psyche_common.event_files import EventRecord, event_files, read_events

LOSSES = {1: [4.0, 3.0, 2.5, 2.0], 2: [4.2, 3.2, 2.7, 2.2]}
FINAL_STEP = 5


def trained(step: int, loss: float) -> Trained:
    return Trained(step=step, epoch=0, loss=loss, batch=(0, 4), payload_bytes=100,
                   seconds=0.1, tokens=512)


async def record_coordinator(directory: Path) -> None:
    """A real server with its recorder: two clients join (Warmup), an observer's event is
    refused, one client leaves; then the run is made Finished at step FINAL_STEP and
    published as any change is."""
    coordinator = Coordinator.from_state_file(make_state_file(init_min_clients=2,
                                                              min_clients=2))
    server = CoordinatorServer(coordinator, server_options(checkpoint_history_check=False))
    recorder = CoordinatorEventRecorder(directory)
    recorder.attach(server)
    async with server:
        one, two = await join(server, identity(1)), await join(server, identity(2))
        observer = await join(server, identity(9), observe=True)
        for _ in range(100):
            if server.state.run_state is RunState.Warmup:
                break
            await asyncio.sleep(0.02)
        await observer.send(wire.Withdraw())
        await asyncio.sleep(0.2)
        await two.close()
        await asyncio.sleep(0.2)
        server.state.run_state = RunState.Finished
        server.state.progress.step = FINAL_STEP
        server.publish()
        await one.close()
        await observer.close()
    recorder.close()


def record_client(directory: Path, number: int) -> ClientEventRecorder:
    events = EventLog("none")
    recorder = ClientEventRecorder(directory, identity(number).node_id, RUN_ID, events)
    events.emit(StateChanged(phase="RoundTrain", epoch=0, step=1, clients=2))
    for step, loss in enumerate(LOSSES[number], start=1):
        events.emit(trained(step, loss))
    events.emit(RunFinished(step=FINAL_STEP))
    return recorder


async def recorded_run(directory: Path) -> None:
    await record_coordinator(directory)
    for number in LOSSES:
        record_client(directory, number).close()


def mean_last_loss() -> float:
    return sum(losses[-1] for losses in LOSSES.values()) / len(LOSSES)


async def until(condition: Callable[[], object], pilot: object, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        await pilot.pause(0.05)  # type: ignore[attr-defined]  # textual Pilot


async def test_server_and_clients_write_what_a_replay_needs(tmp_path: Path) -> None:
    await recorded_run(tmp_path)
    result = read_events(tmp_path)
    assert result.bad == []
    kinds = [(r.source, r.kind) for r in result.records]
    assert ("coordinator", "opened") in kinds and ("coordinator", "refused") in kinds
    assert sum(k == ("coordinator", "joined") for k in kinds) == 3  # two clients, an observer
    assert ("coordinator", "left") in kinds
    refused = next(r for r in result.records if r.kind == "refused")
    assert refused.payload["observer"] is True and refused.payload["error"] == "WrongRunState"
    run = RunReplay()
    for record in result.records:
        run.apply(record)
    summary = run.summary()
    assert summary["run_state"] == "Finished" and summary["step"] == FINAL_STEP
    assert summary["refused"] == 1
    assert {c["trained_steps"] for c in summary["clients"].values()} == {4}
    assert summary["last_loss"] == mean_last_loss()


async def test_replay_tui_shows_the_final_step_and_losses(tmp_path: Path) -> None:
    await recorded_run(tmp_path)
    app = ReplayApp(tmp_path, speed=0)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: app.replay.state is not None
                    and app.replay.state.run_state is RunState.Finished, pilot)
        await pilot.pause(0.3)
        assert "phase Finished" in app.server_text()
        assert f"step {FINAL_STEP}/" in app.server_text()
        from local_testnet.widgets import LossPlot

        assert app.query_one(LossPlot).border_subtitle == f"step 4: {mean_last_loss():.3f}"
        table = app.query_one("#clients")
        assert table.row_count == 2  # type: ignore[attr-defined]  # a DataTable
        assert "at the end" in app.replay_text()
    # Its refresh timer can fire while the app shuts down, after the widgets went (CI saw
    # NoMatches for #replay): such a tick draws nothing and raises nothing.
    assert not app.is_running and not app.query("#replay")
    app.tick()


async def test_following_replay_picks_up_appended_records(tmp_path: Path) -> None:
    await record_coordinator(tmp_path)
    events = EventLog("none")
    recorder = ClientEventRecorder(tmp_path, identity(1).node_id, RUN_ID, events)
    events.emit(trained(1, 4.0))
    app = ReplayApp(tmp_path, speed=0, follow=True)
    async with app.run_test(size=(160, 40)) as pilot:
        source = f"client-{identity(1).node_id[:16]}"
        await until(lambda: source in app.replay.clients, pilot)
        assert app.replay.clients[source].losses == {1: 4.0}
        events.emit(trained(2, 3.25))  # the live client trains on
        await until(lambda: 2 in app.replay.clients[source].losses, pilot)
        assert app.replay.clients[source].loss == 3.25
        assert "following the files" in app.replay_text()
    recorder.close()


async def test_torn_last_line_is_shown_as_such(tmp_path: Path) -> None:
    await recorded_run(tmp_path)
    path = next(p for p in event_files(tmp_path) if p.name.startswith("client-"))
    with path.open("ab") as handle:  # a client killed while writing its next record
        handle.write(b'{"v":1,"time":1.0,"source":"client-x","seq":9,"kind":"trai')
    app = ReplayApp(tmp_path, speed=0)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(lambda: app.replay.records > 0 and not app.playback.queue, pilot)
        await pilot.pause(0.2)
        assert f"{path.name} line" in app.replay_text()
        assert "torn last line" in app.replay_text()
        assert "phase Finished" in app.server_text()  # the rest replays as ever


def test_playback_runs_at_the_chosen_speed() -> None:
    now = [100.0]
    playback = Playback(speed=5, clock=lambda: now[0])
    playback.add([EventRecord(1000.0 + t, "coordinator", "state", {}) for t in (0, 4, 10)])
    assert [r.time for r in playback.due()] == [1000.0]
    now[0] += 1  # 5 s of the run
    assert [r.time for r in playback.due()] == [1004.0]
    now[0] += 1
    assert [r.time for r in playback.due()] == [1010.0]
    assert playback.position_s == 10


def replay_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "local_testnet", "replay", *args],
                          capture_output=True, text=True, timeout=60, check=False)


async def test_replay_cli_no_tui_prints_the_run_and_refuses_a_bad_dir(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    await recorded_run(events)
    done = replay_cli("--events-dir", str(events), "--no-tui")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["run_state"] == "Finished" and summary["step"] == FINAL_STEP
    a_file = tmp_path / "file"
    a_file.write_text("")
    done = replay_cli("--events-dir", str(a_file), "--no-tui")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: --events-dir {a_file} is not a directory"
    (tmp_path / "empty").mkdir()
    done = replay_cli("--events-dir", str(tmp_path / "empty"), "--no-tui")
    assert done.returncode == 1 and done.stderr.startswith("error: no event files in")
