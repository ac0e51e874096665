"""The testnet TUI's views: each client's witness state from a real coordinator's state,
the loss plot from the clients' trained steps, the log pane from the processes' real log
files (in words, never raw JSON), the final summary in words, and an SVG snapshot."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from tcp_helpers import TESTNET, make_state_file
from textual.widgets import DataTable

from coordinator import (
    Bloom,
    Coordinator,
    NodeIdentity,
    RunState,
    Witness,
    participant_item,
    selection_for_round,
)
from local_testnet.client_log import log_path
from local_testnet.summary_words import describe_summary
from local_testnet.testnet import Testnet, TestnetOptions, client_key
from local_testnet.tui import TestnetApp
from local_testnet.widgets import LogPane, LogTail, LossPlot, mean_losses
from local_testnet.witness_state import witness_states

KEYS = {i: client_key(i) for i in (1, 2, 3, 4)}


def closed_base_port() -> int:
    """A base port whose next ports are (almost surely) closed: metrics fetches fail."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1]) - 1


def round_train(clients: list[int]) -> Coordinator:
    coordinator = Coordinator.from_state_file(make_state_file(
        init_min_clients=2, min_clients=2, witness_nodes=2, warmup_time=10,
        max_round_train_time=5, round_witness_time=2, cooldown_time=3))
    coordinator.tick([NodeIdentity(KEYS[i]) for i in clients], 100, 1)
    assert coordinator.state.run_state is RunState.Warmup
    coordinator.tick([], 110, 77)
    assert coordinator.state.run_state is RunState.RoundTrain
    return coordinator


def test_witness_states_follow_the_round() -> None:
    coordinator = round_train([1, 2, 3])
    state = coordinator.state
    elected = selection_for_round(state).witness_indices()
    indices = {i: state.index_of(NodeIdentity(KEYS[i])) for i in (1, 2, 3)}
    number_of = {index: i for i, index in indices.items() if index is not None}
    assert len(number_of) == 3
    before = witness_states(state, KEYS)
    assert before[4] == "not in epoch"
    for index, number in number_of.items():
        assert before[number] == ("witness: waiting" if index in elected else "trainer")
    first = elected[0]
    proof = selection_for_round(state).witness_of(first)
    bloom = Bloom(keys=tuple(range(8)))
    bloom.add(participant_item(state.epoch_state.clients[first].id.key))
    assert coordinator.witness(state.epoch_state.clients[first].id,
                               Witness(proof, participant_bloom=bloom), 111) is None
    after = witness_states(state, KEYS)
    assert after[number_of[first]] == "witness: sent"
    withdrawn = next(i for i in number_of if i != first)
    assert coordinator.withdraw(withdrawn) is None
    assert witness_states(state, KEYS)[number_of[withdrawn]] == "withdrawn"
    assert witness_states(None, KEYS) == dict.fromkeys(KEYS, "")


def test_the_summary_in_words() -> None:
    finished = {"first_loss": 10.9123, "last_loss": 6.2, "steps": 19, "epochs": 2,
                "clients_identical": True, "killed": 1, "rejoined": 1, "wall_s": 95.4,
                "finished": True, "final_step": 20, "run_state": "Finished",
                "checkpoints_compared": 3, "error": None}
    assert describe_summary(finished) == [
        "run finished at step 20, epoch 2, after 1 min 35 s",
        "loss 10.912 -> 6.200 over 19 trained steps (mean of the clients)",
        "checkpoints of 3 clients compared: identical",
        "clients killed 1, rejoined 1"]
    timed_out = {**finished, "finished": False, "run_state": "Warmup", "first_loss": None,
                 "last_loss": None, "steps": 0, "checkpoints_compared": 0,
                 "error": "timed out after 60 s"}
    lines = describe_summary(timed_out)
    assert lines[0].startswith("run stopped before the end (phase Warmup) at step 20")
    assert "loss: no step was trained" in lines and lines[-1] == "error: timed out after 60 s"
    assert all("{" not in line for line in lines)


def test_a_testnets_own_summary_reads_in_words(tmp_path: Path) -> None:
    net = Testnet(TestnetOptions(num_clients=2, config_path=TESTNET, work_dir=tmp_path,
                                 server_port=1))
    net.clients[1].losses.update({1: 10.0, 2: 8.0})
    net.clients[2].losses.update({1: 12.0})
    lines = describe_summary(net.summary())
    assert lines[1] == "loss 11.000 -> 8.000 over 2 trained steps (mean of the clients)"
    assert lines[0].startswith("run stopped before the end (phase never seen)")


def test_mean_losses_and_a_growing_log(tmp_path: Path) -> None:
    assert mean_losses([{1: 10.0, 2: 8.0}, {1: 12.0}]) == [(1, 11.0), (2, 8.0)]
    path = tmp_path / "client-1.log"
    path.write_text("old line of a previous run\n")
    tail = LogTail(path, LogTail.size_of(path))
    assert tail.new_lines() == []
    with path.open("a") as log:
        log.write("first\nhalf a li")
    assert tail.new_lines() == ["first"]
    with path.open("a") as log:
        log.write("ne\n")
    assert tail.new_lines() == ["half a line"]
    assert LogTail(tmp_path / "missing.log").new_lines() == []


def history_testnet(work_dir: Path) -> Testnet:
    """Two clients that trained steps 1-6, their log files with a few events; no process
    runs and no metrics endpoint answers (the status column says the last line)."""
    net = Testnet(TestnetOptions(num_clients=2, config_path=TESTNET, work_dir=work_dir,
                                 server_port=1, metrics_base_port=closed_base_port()))
    for step, loss in enumerate([10.8, 9.9, 9.1, 8.6, 8.2, 7.9], start=1):
        net.clients[1].losses[step] = loss
        net.clients[2].losses[step] = loss + 0.2
    net.clients[1].last_line = json.dumps({"event": "trained", "time": 1.0, "step": 6,
                                           "loss": 7.9})
    net.clients[2].last_line = "plain text from a library"
    return net


def write_logs(work_dir: Path) -> None:
    log_path(work_dir, 1).write_text(
        json.dumps({"event": "trained", "time": 1.0, "step": 6, "loss": 7.9}) + "\n"
        + json.dumps({"event": "removed", "time": 2.0, "epoch": 0, "step": 7,
                      "reason": "health-check", "detail": "a health check dropped it"}) + "\n")
    (work_dir / "server.log").write_text(
        json.dumps({"level": "WARNING", "logger": "x", "message": "client 2 is slow",
                    "time": 1.0}) + "\n")


async def test_the_tui_shows_the_loss_the_logs_and_the_witness_column(tmp_path: Path) -> None:
    net = history_testnet(tmp_path)
    app = TestnetApp(net)
    write_logs(tmp_path)  # written after the TUI started: this run's lines
    async with app.run_test(size=(140, 40)) as pilot:
        await app.refresh_view()
        await pilot.pause()
        plot = app.query_one(LossPlot)
        assert plot.border_subtitle == "step 6: 8.000"
        lines = [line.text for line in app.query_one(LogPane).lines]
        assert "client 1: trained: step 6  loss 7.9" in lines
        # long lines wrap in the pane: the event starts a line, its end follows
        assert any(line.startswith("client 1: removed: epoch 0  step 7  reason health-check")
                   for line in lines)
        assert "check dropped it" in " ".join(lines)
        assert "coordinator: warning: client 2 is slow" in lines
        assert not any("{" in line for line in lines)
        table = app.query_one("#clients", DataTable)
        labels = [str(column.label) for column in table.columns.values()]
        assert labels[-2:] == ["witness", "status"]
        assert table.get_row_at(0)[-1] == "trained: step 6  loss 7.9"
        await pilot.press("q")


def test_snapshot_testnet_tui(snap_compare: Any, tmp_path: Path) -> None:
    net = history_testnet(tmp_path)
    app = TestnetApp(net)
    write_logs(tmp_path)

    async def refreshed(pilot: Any) -> None:
        await app.refresh_view()
        await pilot.pause()

    assert snap_compare(app, run_before=refreshed, terminal_size=(140, 40))


def test_q_in_the_real_tui_prints_the_result_in_words(tmp_path: Path) -> None:
    """`psyche-testnet --tui` on a terminal, a real coordinator and client: q stops them,
    exit 0, and the result is printed in words after the screen is given back."""
    import os
    import signal
    import time

    from tests.local_testnet.test_testnet_stops import (
        Ports,
        Terminal,
        psyche_testnet_args,
        serving,
        started,
        wait_stopped,
        wait_until,
    )

    ports = Ports()
    terminal = Terminal()
    process = terminal.spawn(psyche_testnet_args(tmp_path, ports, "--tui"))
    try:
        with started(process) as tree:
            wait_until(lambda: serving(ports) and b"psyche testnet" in terminal.output,
                       "the testnet TUI", tree)
            os.write(terminal.master, b"q")
            assert process.wait(timeout=30) == 0
            wait_stopped(tree, 5.0)
            deadline = time.monotonic() + 5
            while b"clients killed 0, rejoined 0" not in terminal.output:
                assert time.monotonic() < deadline, terminal.output[-2000:]
                time.sleep(0.1)
        text = terminal.output.decode(errors="replace")
        after = text[text.rindex("stopped: nothing left running"):]
        assert "run stopped before the end (phase " in after
        assert "loss" in after and "{" not in after
        ports.assert_free()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        terminal.close()
