"""The testnet TUI under Pilot: server state from the observer (what the run waits for,
the phase timer on the coordinator's clock), client rows from a real metrics endpoint
(HTTP on loopback) or the process status and last log line in words when it is down."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from pathlib import Path

from tcp_helpers import TESTNET, make_state_file
from textual.widgets import DataTable, Static

from coordinator import Coordinator, NodeIdentity
from local_testnet.client_log import describe_line
from local_testnet.testnet import Testnet, TestnetOptions
from local_testnet.tui import TestnetApp
from psyche_common.metrics_schema import ClientMetrics


def on_screen(app: TestnetApp) -> str:
    return str(app.query_one("#server", Static).render())


def free_port_pair() -> int:
    """A base port such that base+1 is free and base+2 is (almost surely) closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1]) - 1


async def test_testnet_tui_shows_server_and_client_metrics(tmp_path: Path) -> None:
    base = free_port_pair()
    metrics = ClientMetrics(phase="RoundTrain", epoch=1, step=7, loss=6.25, tokens_per_sec=900)
    body = metrics.model_dump_json().encode()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    net = Testnet(TestnetOptions(num_clients=2, config_path=TESTNET, work_dir=tmp_path,
                                 server_port=1, metrics_base_port=base))
    # After the testnet is made: it refuses a chosen metrics port that is already taken.
    http = await asyncio.start_server(serve, "127.0.0.1", base + 1)
    # A run fresh from its state.toml (no phase start yet) that waits for 2 clients: the
    # observer's last update said 1 is connected, at the coordinator's unix time.
    net.state = Coordinator.from_state_file(make_state_file(init_min_clients=2)).state
    net.joined, net.server_time, net.state_received = 1, int(time.time()), time.monotonic()
    net.clients[2].last_line = json.dumps({"event": "state", "time": 1795430322.5,
                                           "phase": "WaitingForMembers", "epoch": 0,
                                           "step": 0, "clients": 0})
    app = TestnetApp(net)
    try:
        async with app.run_test(size=(140, 30)) as pilot:
            await pilot.pause(1.6)
            screen = on_screen(app)
            assert "phase WaitingForMembers — / 1s" in screen  # no Unix time as a timer
            assert "waiting for 2 clients, 1 connected" in screen
            assert "clients 0" not in screen
            assert "killed 0  rejoined 0" in screen
            table = app.query_one("#clients", DataTable)
            rows = [table.get_row_at(i) for i in range(table.row_count)]
            assert rows[0][:6] == ["1", "not started", "RoundTrain", "1", "7", "6.250"]
            assert rows[1][0] == "2"
            assert rows[1][-1] == "state: phase WaitingForMembers  epoch 0  step 0  clients 0"
            assert "{" not in rows[1][-1]
    finally:
        http.close()
        await http.wait_closed()


async def test_testnet_tui_times_the_warmup_on_the_coordinators_clock(tmp_path: Path) -> None:
    net = Testnet(TestnetOptions(num_clients=2, config_path=TESTNET, work_dir=tmp_path,
                                 server_port=1, metrics_base_port=free_port_pair()))
    coordinator = Coordinator.from_state_file(make_state_file())
    started = int(time.time()) - 3600  # the coordinator's clock is an hour behind ours
    coordinator.tick([NodeIdentity(b"\x01" * 32)], now=started, seed=1)
    net.state, net.joined = coordinator.state, 1
    net.server_time, net.state_received = started + 1, time.monotonic()
    net.clients[1].last_line = "plain text from a library"
    app = TestnetApp(net)
    async with app.run_test(size=(140, 30)) as pilot:
        await pilot.pause(1.3)
        screen = on_screen(app)
        timer = re.search(r"phase Warmup (\d+)s / 2s", screen)
        assert timer is not None and 1 <= int(timer[1]) <= 10  # not the hour between the clocks
        assert "warming up: 0 of 1 ready  ·  clients 1  witnesses 0/1 (quorum 1)" in screen
        table = app.query_one("#clients", DataTable)
        assert table.get_row_at(0)[-1] == "plain text from a library"


def test_a_log_line_in_words() -> None:
    event = {"event": "trained", "time": 1.5, "step": 3, "loss": 6.254321, "ok": True,
             "peers": ["a", "b"], "batch_id": None}
    assert describe_line(json.dumps(event)) == (
        "trained: step 3  loss 6.254  ok yes  peers a b  batch id —")
    record = {"level": "WARNING", "logger": "x", "message": "slow peer", "time": 2.0}
    assert describe_line(json.dumps(record)) == "warning: slow peer"
    assert describe_line(json.dumps({**record, "level": "INFO"})) == "slow peer"
    assert describe_line('{"event": "trai') == '{"event": "trai'  # torn: as it is
    assert describe_line("  loading the model ") == "loading the model"
