"""The supervisor against a real Docker engine and the real client image.

The containers here run the real image with Psyche's entry-point override
(`python3 -c ...`) to exit 10, crash or run long on cue, in a second or two each; the
real client (`psyche-client train`) against a real coordinator is test_rm_e2e_tcp.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from run_manager import engine
from run_manager.docker_supervisor import (
    ContainerExited,
    ContainerStarted,
    LogLine,
    RestartScheduled,
    StaleContainerRemoved,
    Supervisor,
    SupervisorConfig,
    SupervisorEvent,
)
from run_manager.sources import PinnedVersionSource

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_containers")]

# Exits 10 (version mismatch) unless the run's version matches the one it was started with.
EXIT_10_UNLESS_V2 = "import os,sys; print('version', os.environ['CLIENT_VERSION']); sys.exit(0 if os.environ['CLIENT_VERSION'].endswith('-v2') else 10)"


def config(run_id: str, script: str) -> SupervisorConfig:
    return SupervisorConfig(
        run_id=run_id, environment={"RUN_ID": run_id}, entrypoint=["python3"],
        command=["-c", script], backoff_base_s=0.2, backoff_max_s=1.0,
        version_change_delay_s=0.1, stop_timeout_s=2, max_crash_restarts=2,
    )  # fmt: skip


def version_of(image: str) -> str:
    return image.rpartition(":")[2]


async def test_exit_10_restarts_with_the_version_the_run_now_wants(
    docker_client: docker.DockerClient, client_image: str, run_id: str
) -> None:
    new_version = f"{version_of(client_image)}-v2"
    docker_client.images.get(client_image).tag("psyche-client", new_version)
    source = PinnedVersionSource(version_of(client_image))
    events: list[SupervisorEvent] = []

    def on_event(event: SupervisorEvent) -> None:
        events.append(event)
        if isinstance(event, ContainerExited) and event.exit_code == 10:
            source.pin(new_version)  # the coordinator now wants the next version

    try:
        supervisor = Supervisor(docker_client, source, config(run_id, EXIT_10_UNLESS_V2), on_event)
        finished = await asyncio.wait_for(supervisor.run(), timeout=120)
    finally:
        docker_client.images.remove(f"psyche-client:{new_version}", noprune=True)
    assert finished.reason == "client-finished"
    started = [e for e in events if isinstance(e, ContainerStarted)]
    assert [s.version for s in started] == [version_of(client_image), new_version]
    assert [e.exit_code for e in events if isinstance(e, ContainerExited)] == [10, 0]
    assert [e.reason for e in events if isinstance(e, RestartScheduled)] == ["version-change"]
    assert LogLine(f"version {new_version}") in events  # the container saw CLIENT_VERSION


async def test_crashes_restart_with_backoff_then_give_up(
    docker_client: docker.DockerClient, client_image: str, run_id: str
) -> None:
    events: list[SupervisorEvent] = []
    source = PinnedVersionSource(version_of(client_image))
    script = "import sys; print('boom'); sys.exit(3)"
    supervisor = Supervisor(docker_client, source, config(run_id, script), events.append)
    finished = await asyncio.wait_for(supervisor.run(), timeout=120)
    assert finished.reason == "gave-up" and "3 times" in finished.message
    restarts = [e for e in events if isinstance(e, RestartScheduled)]
    assert [(r.reason, r.delay_s) for r in restarts] == [("crash", 0.2), ("crash", 0.4)]
    assert [e.exit_code for e in events if isinstance(e, ContainerExited)] == [3, 3, 3]
    assert sum(1 for e in events if e == LogLine("boom")) == 3


async def test_a_client_refused_for_good_is_not_restarted(
    docker_client: docker.DockerClient, client_image: str, run_id: str
) -> None:
    """Exit 11 (the coordinator refused the client: not authorized, wrong run) is final:
    one container, no restart, and the client's own error line is the reason given."""
    events: list[SupervisorEvent] = []
    script = ("import sys; print('error: the coordinator refused this client: NotAuthorized:"
              " no active join authorization', file=sys.stderr, flush=True); sys.exit(11)")
    supervisor = Supervisor(docker_client, PinnedVersionSource(version_of(client_image)),
                            config(run_id, script), events.append)
    finished = await asyncio.wait_for(supervisor.run(), timeout=120)
    assert finished.reason == "refused" and finished.failed
    assert finished.message.endswith("NotAuthorized: no active join authorization")
    assert [e.exit_code for e in events if isinstance(e, ContainerExited)] == [11]
    assert not any(isinstance(e, RestartScheduled) for e in events)


async def test_stop_request_stops_and_removes_a_running_container(
    docker_client: docker.DockerClient, client_image: str, run_id: str
) -> None:
    events: list[SupervisorEvent] = []
    script = "import time; print('training', flush=True); time.sleep(600)"
    supervisor = Supervisor(
        docker_client, PinnedVersionSource(version_of(client_image)), config(run_id, script), events.append
    )
    task = asyncio.ensure_future(supervisor.run())
    for _ in range(600):
        if LogLine("training") in events:
            break
        await asyncio.sleep(0.1)
    [running] = engine.find_managed_containers(docker_client, run_id)
    assert running.attrs["HostConfig"]["NetworkMode"] == "host"
    assert running.attrs["HostConfig"]["ShmSize"] == 1 << 30
    assert running.labels[engine.RUN_ID_LABEL] == run_id
    supervisor.request_restart()
    for _ in range(300):
        if sum(isinstance(e, ContainerStarted) for e in events) == 2 and events.count(LogLine("training")) == 2:
            break
        await asyncio.sleep(0.1)
    assert [e.reason for e in events if isinstance(e, RestartScheduled)] == ["requested"]
    supervisor.request_stop()
    finished = await asyncio.wait_for(task, timeout=60)
    assert finished.reason == "stopped"
    assert engine.find_managed_containers(docker_client, run_id) == []


async def test_a_stale_container_of_the_run_is_removed_first(
    docker_client: docker.DockerClient, client_image: str, run_id: str
) -> None:
    stale = engine.start_container(docker_client, engine.ContainerSpec(
        image=client_image, name=f"stale-{run_id}", environment={},
        labels={engine.MANAGED_BY_LABEL: engine.MANAGED_BY_VALUE, engine.RUN_ID_LABEL: run_id},
        entrypoint=["sleep"], command=["600"],
    ))  # fmt: skip
    events: list[SupervisorEvent] = []
    supervisor = Supervisor(
        docker_client, PinnedVersionSource(version_of(client_image)),
        config(run_id, "print('fresh')"), events.append,
    )  # fmt: skip
    finished = await asyncio.wait_for(supervisor.run(), timeout=120)
    assert finished.reason == "client-finished"
    assert events[0] == StaleContainerRemoved(stale.id or "")
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(stale.id or "")


def test_gpus_without_the_toolkit_give_the_install_message(
    docker_client: docker.DockerClient, client_image: str, run_id: str
) -> None:
    spec = engine.ContainerSpec(
        image=client_image, name=f"gpu-{run_id}", environment={}, gpus=True,
        labels={engine.MANAGED_BY_LABEL: engine.MANAGED_BY_VALUE, engine.RUN_ID_LABEL: run_id},
    )  # fmt: skip
    with pytest.raises(engine.GpuUnavailableError, match="NVIDIA Container Toolkit"):
        engine.start_container(docker_client, spec)
    # The container that failed to start is not left behind (checked by no_leftover_containers).


def test_an_image_neither_local_nor_pullable_is_explained(docker_client: docker.DockerClient) -> None:
    with pytest.raises(engine.ImageUnavailableError, match="not on this machine and cannot be pulled"):
        engine.ensure_image(docker_client, "psyche-client:no-such-version-0")


def test_sigterm_to_the_run_manager_stops_and_removes_the_container(
    docker_client: docker.DockerClient, client_image: str, run_id: str, tmp_path: Path
) -> None:
    env_file = tmp_path / "run.env"
    env_file.write_text(f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS=127.0.0.1:4000\nGPUS=none\n")
    argv = [
        sys.executable, "-c", "from run_manager.cli import main; main()",
        "--env-file", str(env_file), "--no-tui", "--client-version", version_of(client_image),
        "--entrypoint", "python3", "--", "-c", "import time; print('up', flush=True); time.sleep(600)",
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        assert process.stdout is not None
        lines = []
        for line in process.stdout:  # bounded by the deadline and the process's own end
            lines.append(line)
            if line.startswith("[client] up") or time.monotonic() > deadline:
                break
        assert engine.find_managed_containers(docker_client, run_id), "".join(lines)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
    assert process.returncode == 0, "".join(lines) + output
    assert "stopped on request; container removed" in output
    assert engine.find_managed_containers(docker_client, run_id) == []


def test_the_benchmark_runs_and_ends_with_its_json_line(client_image: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.run_manager_containers", "--repeats", "1"],
        capture_output=True, check=False, text=True, timeout=180,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stdout + result.stderr
    import json

    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0 < figures["start_to_running_s"] < 60 and 0 < figures["crash_to_restarted_s"] < 60
