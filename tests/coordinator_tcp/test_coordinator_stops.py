"""`psyche-coordinator run` stops cleanly (issue 16, "Stopping leaves nothing behind"), as
a real process: SIGINT, SIGTERM and SIGHUP close the joined client's connection, save the
state, print "stopping…", exit 0 within a second or two and leave no process and no
listening port; in the TUI (in a real pseudo-terminal) ctrl+c does the same, and so does
closing the terminal (a real hangup, which Textual alone would not survive); a port in use
is one line and exit 1 at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback import free_port
from processes import session_members
from pseudo_terminal import Terminal
from tcp_helpers import RUN_ID, TESTNET, identity, next_state

from coordinator_tcp.client import ProtocolConnection

STOP_WITHIN_S = 5.0  # the bound for a prompt stop
START_WITHIN_S = 60.0  # a cold interpreter on a busy 2-core machine


def write_config(tmp_path: Path, data_port: int) -> tuple[Path, Path]:
    state = (TESTNET / "state.toml").read_text().replace(
        "127.0.0.1:20001", f"127.0.0.1:{data_port}")
    (tmp_path / "state.toml").write_text(state)
    data = (TESTNET / "data.toml").read_text().replace(
        "../../assets/data/train", str(TESTNET.parents[1] / "assets" / "data" / "train"))
    (tmp_path / "data.toml").write_text(data)
    return tmp_path / "state.toml", tmp_path / "data.toml"


def run_args(tmp_path: Path, server_port: int, data_port: int, *extra: str) -> list[str]:
    state, data = write_config(tmp_path, data_port)
    return [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state),
            "--data-config", str(data), "--server-port", str(server_port),
            "--bind-host", "127.0.0.1", "--save-state-dir", str(tmp_path / "saved"), *extra]


def assert_port_free(port: int) -> None:
    with socket.socket() as sock:  # TIME_WAIT is allowed, a listener is not
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()


@contextlib.contextmanager
def cleanup(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> Iterator[None]:
    """Whatever the test does, nothing of the session it started outlives it."""
    try:
        yield
    finally:
        for pid in session_members(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
        if process.stderr is not None:
            process.stderr.close()


async def join_with_retry(port: int) -> ProtocolConnection:
    deadline = time.monotonic() + START_WITHIN_S
    while True:
        try:
            connection, _ = await ProtocolConnection.connect(
                "127.0.0.1", port, identity(1), RUN_ID, "addr", timeout_s=2)
            return connection
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError("the coordinator never listened") from None
            await asyncio.sleep(0.1)


async def closed_by_server(connection: ProtocolConnection, timeout_s: float) -> bool:
    """Whether the server closes the connection within `timeout_s` (messages skipped)."""
    async def until_closed() -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await connection.receive()

    try:
        await asyncio.wait_for(until_closed(), timeout_s)
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: s.name)
async def test_a_signal_stops_it_cleanly_and_leaves_nothing(tmp_path: Path,
                                                            sig: signal.Signals) -> None:
    server_port, data_port = free_port(), free_port()
    process = subprocess.Popen(run_args(tmp_path, server_port, data_port),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    with cleanup(process):
        client = await join_with_retry(server_port)
        await next_state(client)  # it serves: a joined client got the run's state
        started = time.monotonic()
        process.send_signal(sig)
        assert await closed_by_server(client, STOP_WITHIN_S), "the client stayed connected"
        await client.close()
        _, stderr = await asyncio.to_thread(process.communicate, timeout=STOP_WITHIN_S)
        elapsed = time.monotonic() - started
        assert process.returncode == 0, stderr
        assert elapsed < STOP_WITHIN_S
        assert f"stopping… ({sig.name})" in stderr and "state saved" in stderr
        assert "Traceback" not in stderr
        assert (tmp_path / "saved" / "state.bin").exists()
        assert session_members(process.pid) == []
        assert_port_free(server_port)
        assert_port_free(data_port)


@pytest.mark.parametrize("busy", ["server", "data"])
def test_a_port_in_use_is_one_line_and_exit_1_at_once(tmp_path: Path, busy: str) -> None:
    server_port, data_port = free_port(), free_port()
    taken = server_port if busy == "server" else data_port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        started = time.monotonic()
        result = subprocess.run(run_args(tmp_path, server_port, data_port),
                                capture_output=True, text=True, timeout=START_WITHIN_S,
                                check=False)
        elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    # (the server port listened first: its own log lines may come before the error)
    assert lines[-1].startswith(f"error: port {taken} is in use: cannot listen on "
                                f"127.0.0.1:{taken}"), result.stderr
    assert "Traceback" not in result.stderr
    assert elapsed < START_WITHIN_S / 2  # it did not wait for anything
    assert_port_free(server_port)
    assert_port_free(data_port)


@pytest.mark.parametrize("how", ["ctrl+c", "hangup"])
async def test_the_tui_stops_on_ctrl_c_and_when_its_terminal_closes(tmp_path: Path,
                                                                     how: str) -> None:
    server_port, data_port = free_port(), free_port()
    terminal = Terminal()
    process = terminal.spawn(run_args(tmp_path, server_port, data_port, "--tui", "true"))
    try:
        with cleanup(process):
            client = await join_with_retry(server_port)
            await next_state(client)
            deadline = time.monotonic() + START_WITHIN_S
            while f"127.0.0.1:{server_port}" not in terminal.text():  # the TUI is up
                assert time.monotonic() < deadline, "the TUI never showed the server"
                await asyncio.sleep(0.1)
            started = time.monotonic()
            if how == "ctrl+c":
                terminal.type(b"\x03")  # a key in the TUI's raw mode, not a SIGINT
            else:
                terminal.hang_up()
            assert await closed_by_server(client, STOP_WITHIN_S), "the client stayed connected"
            await client.close()
            await asyncio.to_thread(process.wait, STOP_WITHIN_S)
            assert time.monotonic() - started < STOP_WITHIN_S
            assert process.returncode == 0
            assert (tmp_path / "saved" / "state.bin").exists()
            assert session_members(process.pid) == []
            assert_port_free(server_port)
            assert_port_free(data_port)
            if how == "ctrl+c":  # shown in the TUI, then on the terminal it gave back
                await asyncio.sleep(0.3)  # the drain thread's last read
                assert terminal.text().count("stopping… (ctrl+c)") >= 2
    finally:
        terminal.close()
