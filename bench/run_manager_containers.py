"""Benchmark: how fast the run-manager gets the client running, and back after a crash.

  .venv/bin/python -m bench.run_manager_containers [--repeats N] [--real-client]

Needs a running Docker engine (scripts/docker_engine.sh start) and the client image
(scripts/build_client_image.sh). Measures, with the local image:
  start_to_running_s     Supervisor.run() called -> container running (first log line)
  crash_to_restarted_s   container exited with a crash -> replacement running
with crash backoff set to 0 so the figure is the supervisor's and the engine's own cost.
With --real-client, also (once) the real client against a local `psyche-coordinator run`:
  start_to_first_step_s  Supervisor.run() called -> the client logs its first trained step
(version from the coordinator, container start, torch import, model load, warm-up, one
round). Prints the figures, last one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import tomllib
import uuid
from pathlib import Path

import docker

from run_manager import engine
from run_manager.docker_supervisor import (
    ContainerExited,
    LogLine,
    Supervisor,
    SupervisorConfig,
    SupervisorEvent,
)
from run_manager.sources import PinnedVersionSource


async def measure_once(client: docker.DockerClient, version: str) -> tuple[float, float]:
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    marks: dict[str, float] = {}
    ups = 0
    supervisor: Supervisor

    def on_event(event: SupervisorEvent) -> None:
        nonlocal ups
        now = time.perf_counter()
        if event == LogLine("up"):
            ups += 1
            marks.setdefault("running" if ups == 1 else "restarted", now)
            if ups == 2:
                supervisor.request_stop()
        elif isinstance(event, ContainerExited) and "exited" not in marks:
            marks["exited"] = now

    # Each container prints "up" when its Python starts, then crashes after 0.5 s: the
    # first "up" marks running, the second the restart after the first crash.
    script = "import time, sys; print('up', flush=True); time.sleep(0.5); sys.exit(3)"
    config = SupervisorConfig(
        run_id=run_id, entrypoint=["python3"], command=["-c", script],
        backoff_base_s=0.0, max_crash_restarts=3, stop_timeout_s=1,
    )  # fmt: skip
    supervisor = Supervisor(client, PinnedVersionSource(version), config, on_event)
    started = time.perf_counter()
    await asyncio.wait_for(supervisor.run(), timeout=120)
    return marks["running"] - started, marks["restarted"] - marks["exited"]


async def measure_first_step(client: docker.DockerClient, root: Path) -> float:
    """The real client image on a one-client local testnet; seconds to its first step."""
    import os
    import signal
    import socket
    import subprocess
    import tempfile

    import tomli_w

    from run_manager.sources.tcp_coordinator import TcpCoordinatorSource

    def free_port() -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])

    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    port, data_port = free_port(), free_port()
    testnet = root / "config" / "local-testnet"
    state = tomllib.loads((testnet / "state.toml").read_text())
    state.update(run_id=run_id, client_version="test")  # "test": any client version may join
    state["config"].update(init_min_clients=1, waiting_for_members_extra_time=1, total_steps=1000)
    state["model"]["LLM"]["data_location"] = {"Server": f"127.0.0.1:{data_port}"}
    data = tomllib.loads((testnet / "data.toml").read_text())
    data["dir"] = str((testnet / data["dir"]).resolve())
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "state.toml").write_text(tomli_w.dumps(state))
        (Path(work) / "data.toml").write_text(tomli_w.dumps(data))
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "coordinator_tcp", "run", "--state", f"{work}/state.toml",
             "--data-config", f"{work}/data.toml", "--server-port", str(port),
             "--bind-host", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root,
        )  # fmt: skip
        source = TcpCoordinatorSource(f"127.0.0.1:{port}", run_id, wait_s=60)
        marks: dict[str, float] = {}
        supervisor: Supervisor

        def on_event(event: SupervisorEvent) -> None:
            if isinstance(event, LogLine) and " trained step=" in event.text and "step" not in marks:
                marks["step"] = time.perf_counter()
                supervisor.request_stop()

        config = SupervisorConfig(
            run_id=run_id, stop_timeout_s=5, max_crash_restarts=0,
            environment={"RUN_ID": run_id, "SERVER_ADDR": f"127.0.0.1:{port}",
                         "IROH_RELAY": "disabled", "TORCH_THREADS": "1"},
        )  # fmt: skip
        # The image is tagged with the project version; the run accepts any ("test").
        version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
        pinned = PinnedVersionSource(version)
        supervisor = Supervisor(client, pinned, config, on_event)
        try:
            await source.client_version()  # the coordinator is up before the clock starts
            started = time.perf_counter()
            await asyncio.wait_for(supervisor.run(), timeout=300)
        finally:
            await source.close()
            os.kill(coordinator.pid, signal.SIGTERM)
            coordinator.wait(30)
    if "step" not in marks:
        raise SystemExit("bench: the real client never trained a step")
    return marks["step"] - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--real-client", action="store_true",
                        help="also time the real client's first trained step (once)")
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    client = engine.connect()
    engine.ensure_image(client, f"psyche-client:{version}")
    starts, restarts = [], []
    for _ in range(args.repeats):
        start_s, restart_s = asyncio.run(measure_once(client, version))
        starts.append(start_s)
        restarts.append(restart_s)
        print(f"start_to_running {start_s:.3f}s  crash_to_restarted {restart_s:.3f}s")
    result = {
        "start_to_running_s": round(statistics.median(starts), 3),
        "crash_to_restarted_s": round(statistics.median(restarts), 3),
        "repeats": args.repeats,
        "image": f"psyche-client:{version}",
    }
    print(
        f"median: start_to_running {result['start_to_running_s']}s, crash_to_restarted {result['crash_to_restarted_s']}s"
    )
    if args.real_client:
        first_step_s = asyncio.run(measure_first_step(client, root))
        result["start_to_first_step_s"] = round(first_step_s, 3)
        print(f"real client: start_to_first_step {first_step_s:.3f}s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
