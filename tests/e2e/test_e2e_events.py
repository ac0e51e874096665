"""A short real testnet run with `--events-dir` on the coordinator and both clients: the
files hold the coordinator's last state (Finished, the final step) and each client's
trained steps, the same as its log; a replay of them tells the run's summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import events, log_tails, make_testnet

from coordinator_tcp.event_recording import state_of
from local_testnet.replay import RunReplay
from local_testnet.testnet import client_key, run_headless
from psyche_common.event_files import event_files, read_events

pytestmark = pytest.mark.slow


async def test_event_files_of_a_real_run_replay_its_summary(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    directory = tmp_path / "events"
    testnet = make_testnet(tmp_path, 2, client_args=["--events-dir", str(directory)],
                           server_args=["--events-dir", str(directory)],
                           config={"total_steps": 8, "epoch_time": 20, "warmup_time": 15})
    summary = await run_headless(testnet)
    work = testnet.options.work_dir
    assert summary["error"] is None, f"{summary}\n{log_tails(work)}"
    assert summary["finished"]

    sources = {path.name.split(".", 1)[0] for path in event_files(directory)}
    clients = {i: f"client-{client_key(i).hex()[:16]}" for i in (1, 2)}
    assert sources == {"coordinator", *clients.values()}
    result = read_events(directory)
    assert result.bad == [], [b.describe() for b in result.bad]

    last_state = state_of([r for r in result.records
                           if r.source == "coordinator" and r.kind == "state"][-1])
    assert last_state.run_state.name == "Finished"
    assert last_state.progress.step == summary["final_step"]
    for i, source in clients.items():
        in_files = {r.payload["step"]: r.payload["loss"] for r in result.records
                    if r.source == source and r.kind == "trained"}
        in_log = {e["step"]: e["loss"] for e in events(work, i, "trained")}
        assert in_files and in_files == in_log, (i, in_files, in_log)
        assert any(r.source == source and r.kind == "finished" for r in result.records)

    run = RunReplay()
    for record in result.records:
        run.apply(record)
    told = run.summary()
    assert told["run_state"] == "Finished" and told["step"] == summary["final_step"]
    assert told["first_loss"] == pytest.approx(summary["first_loss"])
    assert told["last_loss"] == pytest.approx(summary["last_loss"])
    done = subprocess.run([sys.executable, "-m", "local_testnet", "replay", "--events-dir",
                           str(directory), "--no-tui"], capture_output=True, text=True,
                          timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == told
