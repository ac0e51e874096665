"""`psyche-client train` stops cleanly (issue 16, "Stopping leaves nothing behind"), as a
real process against a real `psyche-coordinator run` on 127.0.0.1: SIGINT, SIGTERM and
SIGHUP while it trains say "stopping…", withdraw it from the run, and end it with exit 0
within seconds, leaving no process of its session and neither its metrics port nor its
P2P port; so does SIGTERM once its coordinator is gone (nothing to withdraw from), and
SIGTERM while it is still starting (before its event loop runs: what a container's
`docker stop` sends to a client that is its PID 1). A ctrl+c of its terminal, which
reaches its rank processes too, stops them all through the client, quietly."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w
from loopback import free_port
from processes import cmdline, session_members
from tcp_helpers import RUN_ID, TESTNET

from coordinator import ClientState, CoordinatorState, RunState, decode_state
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.protocol import StateUpdate
from psyche_common.identity import Identity

pytestmark = pytest.mark.slow

STOP_WITHIN_S = 5.0  # the bound for a prompt stop
START_WITHIN_S = 180.0  # a coordinator and a torch-importing client on a busy 2-core machine
SECRET = bytes(range(1, 33))


def write_run(directory: Path, data_port: int) -> tuple[Path, Path]:
    """The local-testnet run for one client, with short phases."""
    state = tomllib.loads((TESTNET / "state.toml").read_text())
    state["config"].update({"init_min_clients": 1, "min_clients": 1, "warmup_time": 30,
                            "waiting_for_members_extra_time": 1, "cooldown_time": 2,
                            "epoch_time": 600, "max_round_train_time": 10,
                            "round_witness_time": 1})
    state["model"]["LLM"]["data_location"] = {"Server": f"127.0.0.1:{data_port}"}
    (directory / "state.toml").write_text(tomli_w.dumps(state))
    data = tomllib.loads((TESTNET / "data.toml").read_text())
    data["dir"] = str((TESTNET / data["dir"]).resolve())
    (directory / "data.toml").write_text(tomli_w.dumps(data))
    return directory / "state.toml", directory / "data.toml"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def assert_ports_free(tcp_port: int, udp_port: int) -> None:
    with socket.socket() as sock:  # TIME_WAIT is allowed, a listener is not
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", tcp_port))
        sock.listen()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", udp_port))


class Run:
    """A coordinator and one client, each a process in a session of its own; whatever a
    test does, nothing of either session outlives it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.server_port, self.data_port = free_port(), free_port()
        self.metrics_port, self.p2p_port = free_port(), free_udp_port()
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.client: subprocess.Popen[bytes] | None = None
        self.client_log = tmp_path / "client.log"
        self.me = Identity(SECRET).public_key

    def start_coordinator(self) -> None:
        state, data = write_run(self.tmp_path, self.data_port)
        with (self.tmp_path / "coordinator.log").open("wb") as out:
            self.coordinator = subprocess.Popen(
                [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state),
                 "--data-config", str(data), "--server-port", str(self.server_port),
                 "--bind-host", "127.0.0.1", "--tick-interval", "0.2"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def start_client(self, **env: str) -> subprocess.Popen[bytes]:
        script = Path(sys.executable).with_name("psyche-client")
        argv = [str(script)] if script.exists() else [sys.executable, "-m", "client_image.cli"]
        with self.client_log.open("wb") as out:
            self.client = subprocess.Popen(
                [*argv, "train", "--run-id", RUN_ID,
                 "--server-addr", f"127.0.0.1:{self.server_port}",
                 "--bind-p2p-interface", "127.0.0.1", "--bind-p2p-port", str(self.p2p_port),
                 "--iroh-relay", "disabled", "--device", "cpu", "--torch-threads", "1",
                 "--metrics-local-port", str(self.metrics_port), "--logs", "json",
                 "--checkpoint-dir", str(self.tmp_path / "checkpoints")],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "RAW_IDENTITY_SECRET_KEY": SECRET.hex(), **env})
        return self.client

    def output(self) -> str:
        return self.client_log.read_text(errors="replace")

    def kill_all(self) -> None:
        for process in (self.client, self.coordinator):
            if process is None:
                continue
            for pid in session_members(process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)

    async def observer(self) -> ProtocolConnection:
        deadline = time.monotonic() + START_WITHIN_S
        while True:
            try:
                connection, _ = await ProtocolConnection.connect(
                    "127.0.0.1", self.server_port, Identity(bytes(32)), RUN_ID, "",
                    observe=True, timeout_s=2)
                return connection
            except OSError:
                assert time.monotonic() < deadline, "the coordinator never listened"
                await asyncio.sleep(0.2)

    async def wait_training(self, observer: ProtocolConnection) -> None:
        """Until the client is a healthy member of a round that trains."""
        deadline = time.monotonic() + START_WITHIN_S
        while time.monotonic() < deadline:
            assert self.client is not None and self.client.poll() is None, self.output()
            try:
                state = await next_state(observer)
            except TimeoutError:  # a quiet phase: a 30 s warm-up while 2 ranks load
                continue
            if state.run_state in (RunState.RoundTrain, RunState.RoundWitness) and \
                    self.healthy(state) and '"event": "trained"' in self.output():
                return
        raise AssertionError(f"the client never trained:\n{self.output()[-3000:]}")

    def healthy(self, state: CoordinatorState) -> bool:
        return any(c.id.key == self.me and c.state is ClientState.Healthy
                   for c in state.epoch_state.clients)


async def next_state(observer: ProtocolConnection, timeout_s: float = 10.0) -> CoordinatorState:
    async def wait() -> StateUpdate:
        while True:
            message = await observer.receive()
            if isinstance(message, StateUpdate):
                return message

    return decode_state((await asyncio.wait_for(wait(), timeout_s)).state_bytes)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    started = Run(tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


async def wait_exit(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    return await asyncio.to_thread(process.wait, timeout_s)


def assert_left_nothing(run: Run, client: subprocess.Popen[bytes]) -> None:
    left = [f"{pid} {cmdline(pid)[:120]}" for pid in session_members(client.pid)]
    assert left == [], f"left running: {left}"
    assert_ports_free(run.metrics_port, run.p2p_port)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: s.name)
async def test_a_signal_stops_a_training_client_cleanly(run: Run, sig: signal.Signals) -> None:
    run.start_coordinator()
    observer = await run.observer()
    try:
        client = run.start_client()
        await run.wait_training(observer)
        started = time.monotonic()
        client.send_signal(sig)
        code = await wait_exit(client, STOP_WITHIN_S)
        elapsed = time.monotonic() - started
        output = run.output()
        assert code == 0, output[-3000:]
        assert elapsed < STOP_WITHIN_S
        assert f"stopping… ({sig.name})" in output
        assert "withdrew from the run" in output
        assert "Traceback" not in output
        assert_left_nothing(run, client)
        # The coordinator no longer counts it: withdrawn at once, not after a timeout.
        deadline = time.monotonic() + STOP_WITHIN_S
        while run.healthy(await next_state(observer)):
            assert time.monotonic() < deadline, "the coordinator still lists it as healthy"
    finally:
        await observer.close()


async def test_sigterm_stops_a_client_whose_coordinator_is_gone(run: Run) -> None:
    run.start_coordinator()
    observer = await run.observer()
    try:
        client = run.start_client()
        await run.wait_training(observer)
    finally:
        await observer.close()
    assert run.coordinator is not None
    os.killpg(run.coordinator.pid, signal.SIGKILL)  # gone without a word
    run.coordinator.wait(timeout=10)
    deadline = time.monotonic() + 30
    while "coordinator connection lost" not in run.output():
        assert time.monotonic() < deadline, "the client never noticed"
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # reconnecting, with backoff, to nobody
    started = time.monotonic()
    client.send_signal(signal.SIGTERM)
    code = await wait_exit(client, STOP_WITHIN_S)
    output = run.output()
    assert code == 0, output[-3000:]
    assert time.monotonic() - started < STOP_WITHIN_S
    assert "stopping… (SIGTERM)" in output and "withdrew from the run" not in output
    assert "Traceback" not in output
    assert_left_nothing(run, client)


async def test_sigterm_while_starting_ends_it_at_once(run: Run) -> None:
    client = run.start_client()  # nobody listens at its coordinator address: it never joins
    await asyncio.sleep(1.0)  # importing its libraries: no event loop yet
    started = time.monotonic()
    client.send_signal(signal.SIGTERM)
    code = await wait_exit(client, STOP_WITHIN_S)
    assert code == 0, run.output()
    assert time.monotonic() - started < STOP_WITHIN_S
    assert "stopping… (SIGTERM)" in run.output()
    assert_left_nothing(run, client)


async def test_ctrl_c_of_its_terminal_stops_the_client_and_its_ranks(run: Run) -> None:
    run.start_coordinator()
    observer = await run.observer()
    try:
        client = run.start_client(DATA_PARALLELISM="2")
        await run.wait_training(observer)
    finally:
        await observer.close()
    ranks = [pid for pid in session_members(client.pid) if "rank_group" in cmdline(pid)]
    assert ranks, "the client started no rank process"
    started = time.monotonic()
    os.killpg(client.pid, signal.SIGINT)  # a terminal's ctrl+c: the whole process group
    code = await wait_exit(client, STOP_WITHIN_S)
    output = run.output()
    assert code == 0, output[-3000:]
    assert time.monotonic() - started < STOP_WITHIN_S
    assert "stopping… (SIGINT)" in output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    deadline = time.monotonic() + 2
    while session_members(client.pid):  # the ranks, stopped by the client, exit too
        assert time.monotonic() < deadline, f"left running: {session_members(client.pid)}"
        await asyncio.sleep(0.1)
    assert_left_nothing(run, client)
