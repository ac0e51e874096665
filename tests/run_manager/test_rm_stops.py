"""`run-manager --no-tui` stops cleanly (issue 16, "Stopping leaves nothing behind"), with
the real client image (`psyche-client train`, under the init the run-manager gives the
container): SIGINT, SIGTERM or SIGHUP say "stopping…", stop the client container with a
SIGTERM its client handles (exit 0, or 143 when it came before the client took its
signals; never 137, a SIGKILL after the grace period), remove it and exit 0, well within
the grace period. Whether the client is still starting, cannot reach its coordinator, or
trains in a real run (then it withdraws from the run first)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from loopback import free_port
from tcp_run import write_run_files

from run_manager import engine
from run_manager.docker_supervisor import SupervisorConfig
from run_manager.sources import TcpCoordinatorSource

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_containers")]

RUN_MANAGER = [sys.executable, "-c", "from run_manager.cli import main; main()"]
START_WITHIN_S = 240.0  # the image's first build, torch imports on a busy 2-core machine
# Under the run-manager's grace period before SIGKILL: the client stopped by itself.
STOP_WITHIN_S = float(SupervisorConfig.stop_timeout_s)
CLEAN_EXIT_CODES = (0, 128 + signal.SIGTERM)


def version_of(image: str) -> str:
    return image.rpartition(":")[2]


class RunManager:
    """One `run-manager --no-tui` process, its output in a file; killed (and its
    container removed by the fixture) if a test leaves it running."""

    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "run-manager.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.coordinator: subprocess.Popen[bytes] | None = None

    def start(self, env_file: Path, *args: str) -> subprocess.Popen[bytes]:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [*RUN_MANAGER, "--env-file", str(env_file), "--no-tui", *args],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self.process

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_for_line(self, text: str, timeout_s: float = START_WITHIN_S) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output():
            assert self.process is not None and self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output()[-3000:]}"
            await asyncio.sleep(0.1)

    def kill(self) -> None:
        for process in (self.process, self.coordinator):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture
def run_manager(tmp_path: Path) -> Iterator[RunManager]:
    started = RunManager(tmp_path)
    try:
        yield started
    finally:
        started.kill()


def container_exit_codes(client: docker.DockerClient, run_id: str, since: float) -> list[int]:
    """The exit code of every container of the run that stopped since `since`, as the
    engine recorded it (what `docker inspect` showed before it was removed)."""
    events = client.events(since=int(since), until=int(time.time()) + 1, decode=True,
                           filters={"type": "container", "event": "die",
                                    "label": f"{engine.RUN_ID_LABEL}={run_id}"})
    return [int(event["Actor"]["Attributes"]["exitCode"]) for event in events]


async def stop_and_check(run_manager: RunManager, sig: signal.Signals,
                         docker_client: docker.DockerClient, run_id: str,
                         since: float) -> str:
    """Send `sig`; the run-manager must stop its container cleanly and exit 0 in time."""
    process = run_manager.process
    assert process is not None
    [container] = engine.find_managed_containers(docker_client, run_id)
    assert container.attrs["HostConfig"]["Init"] is True  # signals reach the client
    started = time.monotonic()
    process.send_signal(sig)
    code = await asyncio.to_thread(process.wait, STOP_WITHIN_S + 10)
    elapsed = time.monotonic() - started
    output = run_manager.output()
    assert code == 0, output[-3000:]
    assert elapsed < STOP_WITHIN_S, f"{elapsed:.1f} s: the container was killed, not stopped"
    assert f"stopping… ({sig.name})" in output
    assert "stopped on request; container removed" in output
    assert "Traceback" not in output
    assert engine.find_managed_containers(docker_client, run_id) == []
    codes = container_exit_codes(docker_client, run_id, since)
    assert len(codes) == 1 and codes[0] in CLEAN_EXIT_CODES, (codes, output[-3000:])
    return output


@pytest.mark.parametrize(("when", "sig"), [
    ("starting", signal.SIGTERM),
    ("coordinator unreachable", signal.SIGINT),
    ("coordinator unreachable", signal.SIGHUP),
], ids=["starting-SIGTERM", "unreachable-SIGINT", "unreachable-SIGHUP"])
async def test_a_signal_stops_the_client_container_and_the_run_manager(
    docker_client: docker.DockerClient, client_image: str, run_id: str, tmp_path: Path,
    run_manager: RunManager, when: str, sig: signal.Signals,
) -> None:  # fmt: skip
    env_file = tmp_path / "run.env"
    env_file.write_text(  # nobody listens at the coordinator's address
        f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS=127.0.0.1:{free_port()}\nGPUS=none\n"
        "IROH_RELAY=disabled\nTORCH_THREADS=1\nMAX_CRASH_RESTARTS=0\n")
    since = time.time()
    run_manager.start(env_file, "--client-version", version_of(client_image))
    if when == "starting":  # the client is still importing its libraries
        await run_manager.wait_for_line(f"container {client_image}: running")
    else:  # its event loop runs and it retries the coordinator, with backoff
        await run_manager.wait_for_line("coordinator connection lost")
    output = await stop_and_check(run_manager, sig, docker_client, run_id, since)
    assert "withdrew from the run" not in output  # it never joined


async def test_sigterm_stops_a_training_client_which_withdraws_first(
    docker_client: docker.DockerClient, client_image: str, run_id: str, tmp_path: Path,
    run_manager: RunManager,
) -> None:  # fmt: skip
    version = version_of(client_image)
    port, data_port = free_port(), free_port()
    state, data = write_run_files(tmp_path / "run", version, data_port, run_id)
    with (tmp_path / "coordinator.log").open("wb") as out:
        run_manager.coordinator = subprocess.Popen(
            [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state),
             "--data-config", str(data), "--server-port", str(port), "--bind-host",
             "127.0.0.1", "--tick-interval", "0.2"],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    env_file = tmp_path / "run.env"
    env_file.write_text(
        f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS=127.0.0.1:{port}\nGPUS=none\n"
        "IROH_RELAY=disabled\nTORCH_THREADS=1\nMAX_CRASH_RESTARTS=0\nCOORDINATOR_WAIT_S=60\n")
    since = time.time()
    run_manager.start(env_file)
    observer = TcpCoordinatorSource(f"127.0.0.1:{port}", run_id, wait_s=60, max_backoff_s=0.5)
    try:
        assert await observer.client_version() == version  # the observer follows the run
        await run_manager.wait_for_line("trained step=")
        snapshot = await observer.snapshot()
        assert snapshot is not None and [c.state for c in snapshot.clients] == ["Healthy"]
        output = await stop_and_check(run_manager, signal.SIGTERM, docker_client, run_id,
                                      since)
        assert container_exit_codes(docker_client, run_id, since) == [0]  # it handled it
        assert "withdrew from the run" in output
    finally:
        await observer.close()


class TuiRunManager:
    """One `run-manager` with its TUI, on a pseudo-terminal whose output is collected."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.output = bytearray()
        self._master = -1

    def start(self, env_file: Path, *args: str) -> None:
        import pty

        self._master, slave = pty.openpty()
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
        self.process = subprocess.Popen([*RUN_MANAGER, "--env-file", str(env_file), *args],
                                        stdin=slave, stdout=slave, stderr=slave, env=env,
                                        start_new_session=True)
        os.close(slave)
        os.set_blocking(self._master, False)

    def drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except (BlockingIOError, OSError):
                return
            if not chunk:
                return
            self.output += chunk

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        if self._master >= 0:
            os.close(self._master)
            self._master = -1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_the_tui_stops_the_container_on_a_signal_and_gives_the_terminal_back(
    docker_client: docker.DockerClient, client_image: str, run_id: str, tmp_path: Path,
    sig: signal.Signals,
) -> None:  # fmt: skip
    env_file = tmp_path / "run.env"
    env_file.write_text(  # nobody listens at the coordinator's address
        f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS=127.0.0.1:{free_port()}\nGPUS=none\n"
        "IROH_RELAY=disabled\nTORCH_THREADS=1\nMAX_CRASH_RESTARTS=0\n")
    tui = TuiRunManager()
    since = time.time()
    try:
        tui.start(env_file, "--client-version", version_of(client_image))
        deadline = time.monotonic() + START_WITHIN_S
        while not engine.find_managed_containers(docker_client, run_id):
            tui.drain()
            assert tui.process is not None and tui.process.poll() is None, bytes(tui.output)
            assert time.monotonic() < deadline, "no client container started"
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)  # the app is drawn and supervising
        assert tui.process is not None
        started = time.monotonic()
        tui.process.send_signal(sig)
        while tui.process.poll() is None and time.monotonic() - started < STOP_WITHIN_S + 10:
            tui.drain()
            await asyncio.sleep(0.1)
        tui.drain()
        elapsed = time.monotonic() - started
        assert tui.process.poll() == 0, bytes(tui.output)[-2000:]
        assert elapsed < STOP_WITHIN_S, f"{elapsed:.1f} s: the container was killed, not stopped"
        assert engine.find_managed_containers(docker_client, run_id) == []
        codes = container_exit_codes(docker_client, run_id, since)
        assert len(codes) == 1 and codes[0] in CLEAN_EXIT_CODES, codes
        if sig is signal.SIGTERM:  # the terminal is still there: the app gave it back
            assert bytes(tui.output).rfind(b"\x1b[?1049l") > bytes(tui.output).rfind(
                b"\x1b[?1049h") >= 0
    finally:
        tui.close()
