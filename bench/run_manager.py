# ruff: noqa: E402  (bench/ leaves the import path before the package is imported)
"""Benchmark: how fast the run-manager gets the client running, and back after a crash.

  .venv/bin/python bench/run_manager.py [--repeats N]

Needs a running Docker engine (scripts/docker_engine.sh start) and the client image
(scripts/build_client_image.sh). Measures, with the local image:
  start_to_running_s     Supervisor.run() called -> container running (first log line)
  crash_to_restarted_s   container exited with a crash -> replacement running
with crash backoff set to 0 so the figure is the supervisor's and the engine's own cost.
Prints the figures, last one JSON line.
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

# This script shares its name with the package: take bench/ off the import path so
# `run_manager` below is the package, not this file.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from run_manager import engine
from run_manager.docker_supervisor import (
    ContainerExited,
    LogLine,
    Supervisor,
    SupervisorConfig,
    SupervisorEvent,
)
from run_manager.sources import PinnedVersionSource


async def measure_once(client: object, version: str) -> tuple[float, float]:
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
    supervisor = Supervisor(client, PinnedVersionSource(version), config, on_event)  # type: ignore[arg-type]
    started = time.perf_counter()
    await asyncio.wait_for(supervisor.run(), timeout=120)
    return marks["running"] - started, marks["restarted"] - marks["exited"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
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
    print(json.dumps(result))


if __name__ == "__main__":
    main()
