"""The testnet TUI under Pilot: server state from the observer, client rows from a real
metrics endpoint (HTTP on loopback) or the process status when it is down."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from tcp_helpers import TESTNET, make_state_file
from textual.widgets import DataTable

from coordinator import Coordinator
from local_testnet.testnet import Testnet, TestnetOptions
from local_testnet.tui import TestnetApp
from psyche_common.metrics_schema import ClientMetrics


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

    http = await asyncio.start_server(serve, "127.0.0.1", base + 1)
    net = Testnet(TestnetOptions(num_clients=2, config_path=TESTNET, work_dir=tmp_path,
                                 server_port=1, metrics_base_port=base))
    net.state = Coordinator.from_state_file(make_state_file()).state
    net.clients[2].last_line = "loading the model"
    app = TestnetApp(net)
    try:
        async with app.run_test(size=(140, 30)) as pilot:
            await pilot.pause(1.6)
            assert "phase WaitingForMembers" in app.server_text()
            assert "killed 0  rejoined 0" in app.server_text()
            table = app.query_one("#clients", DataTable)
            rows = [table.get_row_at(i) for i in range(table.row_count)]
            assert rows[0][:6] == ["1", "not started", "RoundTrain", "1", "7", "6.250"]
            assert rows[1][0] == "2" and rows[1][-1] == "loading the model"
    finally:
        http.close()
        await http.wait_closed()
