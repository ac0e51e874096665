"""END TO END: `run-manager --env-file run.env --no-tui` runs the real client image
against a real `psyche-coordinator run` (TCP, with its data server) on 127.0.0.1.

One test walks the whole life of a client container, because each client start costs
seconds of torch imports on a small machine:
  1. the run-manager asks the coordinator for the version, starts psyche-client:V, which
     joins and trains on CPU: the coordinator (seen through an observer) lists it and its
     step advances; the client's metrics endpoint (read with HttpClientMetricsSource)
     reports a finite loss;
  2. the coordinator is restarted demanding V-v2: the client exits 10 and the run-manager
     starts psyche-client:V-v2 (the same image under a second tag), which joins;
  3. SIGTERM to the run-manager: the container is stopped and removed, exit code 0.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import docker
import pytest
from loopback import free_port
from tcp_run import write_run_files

from psyche_common.metrics_schema import ClientMetrics
from psyche_common.metrics_source import HttpClientMetricsSource, MetricsUnavailable
from psyche_common.run_view import RunSnapshot
from run_manager import engine
from run_manager.sources import TcpCoordinatorSource

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_MANAGER = [sys.executable, "-c", "from run_manager.cli import main; main()"]


def version_of(image: str) -> str:
    return image.rpartition(":")[2]


class Processes:
    """Every process the test starts, stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        self.started.append(process)
        return process

    def stop(self, process: subprocess.Popen[bytes], timeout_s: float = 30) -> int:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
        return process.wait(10)

    def stop_all(self) -> None:
        for process in self.started:
            self.stop(process, 10)


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    yield started
    started.stop_all()


def start_coordinator(processes: Processes, directory: Path, port: int) -> subprocess.Popen[bytes]:
    state, data = directory / "state.toml", directory / "data.toml"
    argv = [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state),
            "--data-config", str(data), "--server-port", str(port), "--bind-host", "127.0.0.1",
            "--tick-interval", "0.2"]  # fmt: skip
    return processes.start(argv, directory / "coordinator.log", directory)


_T = TypeVar("_T")


async def wait_for(what: str, check: Callable[[], Awaitable[_T | None]], timeout_s: float,
                   log: Path | None = None) -> _T:
    """Polls the async `check` until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = await check()
        if result:
            return result
        await asyncio.sleep(0.5)
    tail = "" if log is None else "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}\n{tail}", pytrace=False)


async def test_run_manager_trains_a_real_client_changes_version_and_stops_on_sigterm(
    docker_client: docker.DockerClient, client_image: str, tmp_path: Path, run_id: str,
    processes: Processes, no_leftover_containers: None,
) -> None:  # fmt: skip
    version = version_of(client_image)
    new_version = f"{version}-v2"
    docker_client.images.get(client_image).tag("psyche-client", new_version)
    port, data_port, metrics_port = free_port(), free_port(), free_port()
    write_run_files(tmp_path / "v1", version, data_port, run_id)
    write_run_files(tmp_path / "v2", new_version, data_port, run_id)
    env_file = tmp_path / "run.env"
    env_file.write_text(
        f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS=127.0.0.1:{port}\nGPUS=none\n"
        f"METRICS_LOCAL_PORT={metrics_port}\nIROH_RELAY=disabled\nTORCH_THREADS=1\n"
        "VERSION_CHANGE_DELAY_S=0.5\nMAX_CRASH_RESTARTS=0\nCOORDINATOR_WAIT_S=60\n"
    )
    log = tmp_path / "run-manager.log"
    observer = TcpCoordinatorSource(f"127.0.0.1:{port}", run_id, wait_s=30, max_backoff_s=0.5)
    metrics = HttpClientMetricsSource(metrics_port)
    try:
        start_coordinator(processes, tmp_path / "v1", port)
        run_manager = processes.start([*RUN_MANAGER, "--env-file", str(env_file), "--no-tui"], log, tmp_path)

        # 1. The client joins and trains: listed by the coordinator, steps advance.
        assert await observer.client_version() == version

        async def trained_steps() -> RunSnapshot | None:
            snapshot = await observer.snapshot()
            assert run_manager.poll() is None, log.read_text()
            ok = snapshot is not None and len(snapshot.clients) == 1 and snapshot.step >= 4
            return snapshot if ok else None

        snapshot = await wait_for("the client to train 3 steps", trained_steps, 240, log)
        assert snapshot.clients[0].state == "Healthy" and snapshot.phase in ("RoundTrain", "RoundWitness")

        async def a_loss() -> ClientMetrics | None:
            try:
                reported = await metrics.fetch()
            except MetricsUnavailable:
                return None
            return reported if reported.loss is not None else None

        reported = await wait_for("a loss on the client's metrics endpoint", a_loss, 60, log)
        assert reported.loss is not None  # a_loss waited for one
        assert math.isfinite(reported.loss) and 0 < reported.loss < 20
        assert reported.client_version == version and reported.step >= 1
        [container] = engine.find_managed_containers(docker_client, run_id)
        assert container.labels[engine.CLIENT_VERSION_LABEL] == version
        assert f"SERVER_ADDR=127.0.0.1:{port}" in container.attrs["Config"]["Env"]

        # 2. The coordinator now demands another version: exit 10, restart with it.
        processes.stop(processes.started[0])
        start_coordinator(processes, tmp_path / "v2", port)

        async def coordinator_wants_new_version() -> bool:
            return await observer.client_version() == new_version

        await wait_for(f"the coordinator to want {new_version}", coordinator_wants_new_version, 60)

        async def new_version_joined() -> bool:
            snapshot = await observer.snapshot()
            assert run_manager.poll() is None, log.read_text()
            running = engine.find_managed_containers(docker_client, run_id)
            on_new = [c for c in running if c.labels[engine.CLIENT_VERSION_LABEL] == new_version]
            return bool(on_new) and snapshot is not None and len(snapshot.clients) == 1

        await wait_for(f"the {new_version} client to join", new_version_joined, 180, log)
        output = log.read_text()
        assert f"version_mismatch wanted={new_version} running={version}" in output
        assert f"container psyche-client:{version}: exited (10)" in output
        assert "restart (version-change)" in output
        assert f"container psyche-client:{new_version}: running" in output

        # 3. SIGTERM: the container is stopped and removed, the run-manager exits 0.
        assert processes.stop(run_manager, timeout_s=60) == 0, log.read_text()
        assert "stopped on request; container removed" in log.read_text()
        assert engine.find_managed_containers(docker_client, run_id) == []
    finally:
        await observer.close()
        await metrics.close()
        processes.stop_all()
        docker_client.images.remove(f"psyche-client:{new_version}", noprune=True)


def test_an_unreachable_coordinator_stops_the_run_manager_with_its_address(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    port = free_port()  # nobody listens there
    env_file = tmp_path / "run.env"
    env_file.write_text(f"RUN_ID=nobody-{port}\nCOORDINATOR_ADDRESS=127.0.0.1:{port}\nGPUS=none\nCOORDINATOR_WAIT_S=1\n")
    result = subprocess.run([*RUN_MANAGER, "--env-file", str(env_file), "--no-tui"],
                            capture_output=True, check=False, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"no state from the coordinator at 127.0.0.1:{port}" in result.stderr
    assert engine.find_managed_containers(docker_client, f"nobody-{port}") == []
