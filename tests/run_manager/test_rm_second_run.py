"""Two run-managers on one host (issue 16, "No dead ends"): the second one for the same
RUN_ID refuses in one line naming the first one's running container (which it used to
remove as a leftover), a second run's client gets a free metrics port when the first one's
client holds 6269 (and says which), and a metrics port the user chose that is taken is a
one-line error. Real run-manager processes, a real engine, the real client image."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
from pathlib import Path

import docker
import pytest
from loopback import free_port
from test_rm_stops import RUN_MANAGER, RunManager, version_of

from run_manager import engine
from run_manager.host_conflicts import DEFAULT_METRICS_PORT


def env_file(directory: Path, run_id: str, extra: str = "") -> Path:
    path = directory / f"{run_id}.env"
    path.write_text(  # nobody listens at the coordinator's address: the client retries
        f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS=127.0.0.1:{free_port()}\nGPUS=none\n"
        f"IROH_RELAY=disabled\nTORCH_THREADS=1\nMAX_CRASH_RESTARTS=0\n{extra}")
    return path


@pytest.mark.parametrize("how", ["env", "option"])
def test_a_chosen_metrics_port_that_is_taken_is_one_line(tmp_path: Path, how: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--env-file", str(env_file(tmp_path, "taken", f"METRICS_LOCAL_PORT={port}\n"
                                           if how == "env" else "")), "--no-tui"]
        if how == "option":
            args += ["--metrics-local-port", str(port)]
        done = subprocess.run([*RUN_MANAGER, *args], capture_output=True, text=True,
                              timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"run-manager: METRICS_LOCAL_PORT {port} is in use on 127.0.0.1 (another client on "
        "this host?); choose another or leave it unset"]


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_containers")
@pytest.mark.timeout(400)
async def test_a_second_run_manager_on_the_host(
    docker_client: docker.DockerClient, client_image: str, run_id: str, tmp_path: Path,
) -> None:  # fmt: skip
    first = RunManager(tmp_path)
    other_run = f"{run_id}-b"
    try:
        first.start(env_file(tmp_path, run_id), "--client-version", version_of(client_image))
        await first.wait_for_line("coordinator connection lost")  # its metrics server is up
        assert first.process is not None
        [running] = engine.find_managed_containers(docker_client, run_id)
        moved = re.search(r"client metrics on 127\.0\.0\.1:(\d+)", first.output())
        first_port = int(moved.group(1)) if moved else DEFAULT_METRICS_PORT

        same = subprocess.run(
            [*RUN_MANAGER, "--env-file", str(env_file(tmp_path, run_id)), "--no-tui",
             "--client-version", version_of(client_image)],
            capture_output=True, text=True, timeout=90, check=False)
        assert same.returncode == 1, same.stderr
        assert "Traceback" not in same.stderr
        assert same.stderr.strip().splitlines()[-1] == (
            f"run-manager: run {run_id!r} already has a client on this host: container "
            f"{running.name} (running), managed by run-manager pid {first.process.pid}; "
            "stop that one first (one client per run and host)")
        [still] = engine.find_managed_containers(docker_client, run_id)
        still.reload()
        assert still.id == running.id and still.status == "running"  # left alone

        # Another run beside it: its client (here `true`, done at once) gets another port.
        other = subprocess.run(
            [*RUN_MANAGER, "--env-file", str(env_file(tmp_path, other_run)), "--no-tui",
             "--client-version", version_of(client_image), "--entrypoint", "true"],
            capture_output=True, text=True, timeout=120, check=False)
        assert other.returncode == 0, other.stderr
        said = re.search(rf"port {DEFAULT_METRICS_PORT} is in use \(another run on this "
                         r"host\?\): client metrics on 127\.0\.0\.1:(\d+)", other.stderr)
        assert said is not None, other.stderr
        assert int(said.group(1)) != first_port
        assert engine.find_managed_containers(docker_client, other_run) == []

        assert first.process is not None
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(30) == 0, first.output()[-3000:]
    finally:
        first.kill()
        for leftover in engine.find_managed_containers(docker_client, other_run):
            engine.remove_container(leftover)
