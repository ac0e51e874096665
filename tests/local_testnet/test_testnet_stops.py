"""`psyche-testnet` stops everything it started (issue 16, "Stopping leaves nothing
behind"), as a real process with a real coordinator and client: SIGTERM (headless, a client
with a rank process of its own) and closing the terminal of `--tui` (a real hangup of a
pseudo-terminal) stop every process group, say "stopping…" and exit 128 + the signal;
a SIGKILLed testnet's watchdog still ends them. Afterwards no process of any session it
started is alive and its ports are free."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from loopback import free_port
from processes import cmdline
from pseudo_terminal import Terminal
from tcp_helpers import ROOT, TESTNET

START_WITHIN_S = 120.0  # a coordinator and torch-importing clients on a busy 2-core machine
STOP_WITHIN_S = 20.0  # the testnet's grace before SIGKILL is 10 s; a clean stop takes ~2 s


def proc_stat(pid: int) -> list[bytes] | None:
    """/proc/PID/stat after "(comm)": state, ppid, pgrp, session, ..."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def live_processes() -> dict[int, list[bytes]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := proc_stat(int(entry.name))) is not None \
                and fields[0] not in (b"Z", b"X"):
            found[int(entry.name)] = fields
    return found


class Started:
    """The testnet process and what it started: every session it and its children lead."""

    def __init__(self, process: subprocess.Popen[bytes] | subprocess.Popen[str]):
        self.process = process
        self.sessions = {process.pid}

    def children(self) -> list[int]:
        return [pid for pid, fields in live_processes().items()
                if int(fields[1]) == self.process.pid]

    def note_children(self) -> None:
        for pid in self.children():
            fields = proc_stat(pid)
            if fields is not None:
                self.sessions.add(int(fields[3]))

    def left(self) -> list[str]:
        """Live processes of any session it started (empty: nothing left behind)."""
        return [f"{pid} {cmdline(pid)[:120]}" for pid, fields in live_processes().items()
                if int(fields[3]) in self.sessions]

    def kill_all(self) -> None:
        for pid, fields in live_processes().items():
            if int(fields[3]) in self.sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def started(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> Iterator[Started]:
    """The test's process; whatever happens, nothing of it outlives the test."""
    tree = Started(process)
    try:
        yield tree
    finally:
        tree.note_children()
        tree.kill_all()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def write_config(directory: Path, data_port: int, init_min_clients: int) -> Path:
    state = (TESTNET / "state.toml").read_text().replace(
        "127.0.0.1:20001", f"127.0.0.1:{data_port}").replace(
        "init_min_clients = 3", f"init_min_clients = {init_min_clients}")
    directory.mkdir()
    (directory / "state.toml").write_text(state)
    (directory / "data.toml").write_text((TESTNET / "data.toml").read_text().replace(
        "../../assets/data/train", str(ROOT / "assets" / "data" / "train")))
    return directory


class Ports:
    def __init__(self) -> None:
        self.server, self.data, self.metrics = free_port(), free_port(), free_port()

    def args(self) -> list[str]:  # client 1 serves its metrics on base + 1
        return ["--server-port", str(self.server), "--data-port", str(self.data),
                "--metrics-base-port", str(self.metrics - 1)]

    def assert_free(self) -> None:
        for port in (self.server, self.data, self.metrics):
            with socket.socket() as sock:  # TIME_WAIT is allowed, a listener is not
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
                sock.listen()


def psyche_testnet_args(tmp_path: Path, ports: Ports, *extra: str, init_min_clients: int = 3) -> list[str]:
    config = write_config(tmp_path / "config", ports.data, init_min_clients)
    return [sys.executable, "-m", "local_testnet", "--num-clients", "1", "--config-path",
            str(config), "--work-dir", str(tmp_path / "work"), *ports.args(), *extra]


def accepting(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def wait_until(condition: Callable[[], bool], what: str, tree: Started,
               timeout_s: float = START_WITHIN_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert tree.process.poll() is None, f"the testnet exited ({tree.process.returncode})"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    tree.note_children()


def wait_stopped(tree: Started, timeout_s: float = STOP_WITHIN_S) -> None:
    deadline = time.monotonic() + timeout_s
    while tree.left():
        assert time.monotonic() < deadline, f"left running: {tree.left()}"
        time.sleep(0.1)


def serving(ports: Ports) -> bool:
    """The coordinator listens and client 1 is up (its metrics endpoint answers)."""
    return accepting(ports.server) and accepting(ports.metrics)


def test_sigterm_stops_every_process_group_of_a_headless_testnet(tmp_path: Path) -> None:
    ports = Ports()
    # One client of two ranks (DATA_PARALLELISM reaches it from the environment): the rank
    # process is the client's child, in the client's process group; the run starts with
    # this one client, so it loads the model and starts that rank.
    process = subprocess.Popen(
        psyche_testnet_args(tmp_path, ports, "--headless", "--timeout", "600", init_min_clients=1),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, "DATA_PARALLELISM": "2"})
    with started(process) as tree:
        def rank_started() -> bool:
            clients = [pid for pid in tree.children() if "psyche-client" in cmdline(pid)]
            return bool(clients) and any(
                "rank_group" in cmdline(pid) and int(fields[1]) == clients[0]
                for pid, fields in live_processes().items())

        wait_until(lambda: serving(ports) and rank_started(), "the client's rank", tree)
        assert len(tree.sessions) == 4  # the testnet, its watchdog, coordinator, client
        started_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=STOP_WITHIN_S)
        assert time.monotonic() - started_at < STOP_WITHIN_S
        assert process.returncode == 128 + signal.SIGTERM, stderr
        assert "stopping… (SIGTERM)" in stderr and "Traceback" not in stderr
        summary = json.loads(stdout.strip().splitlines()[-1])
        assert summary["error"] == "stopped by SIGTERM" and summary["finished"] is False
        server_log = (tmp_path / "work" / "server.log").read_text()
        assert "stopping… (SIGTERM)" in server_log and "state saved" in server_log
        wait_stopped(tree, 2.0)  # its own exit came after every group was gone
        ports.assert_free()


def test_closing_the_terminal_of_the_tui_stops_everything(tmp_path: Path) -> None:
    ports = Ports()
    terminal = Terminal()
    process = terminal.spawn(psyche_testnet_args(tmp_path, ports, "--tui"), cwd=ROOT)
    try:
        with started(process) as tree:
            wait_until(lambda: serving(ports) and b"psyche testnet" in terminal.output,
                       "the testnet TUI", tree)
            started_at = time.monotonic()
            terminal.hang_up()
            process.wait(timeout=STOP_WITHIN_S)
            assert time.monotonic() - started_at < STOP_WITHIN_S
            assert process.returncode == 128 + signal.SIGHUP
            server_log = (tmp_path / "work" / "server.log").read_text()
            assert "stopping… (SIGTERM)" in server_log  # stopped by the testnet, cleanly
            wait_stopped(tree, 2.0)
            ports.assert_free()
    finally:
        terminal.close()


def test_a_sigkilled_testnet_leaves_nothing_behind(tmp_path: Path) -> None:
    ports = Ports()
    process = subprocess.Popen(psyche_testnet_args(tmp_path, ports, "--headless"), cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    with started(process) as tree:
        wait_until(lambda: serving(ports), "the coordinator and the client", tree)
        process.kill()  # no chance to clean up: its watchdog must
        process.wait(timeout=10)
        wait_stopped(tree)
        ports.assert_free()
