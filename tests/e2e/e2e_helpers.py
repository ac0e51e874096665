"""Whole runs on this machine: a real coordinator process, real client processes, real
iroh on loopback. Built on `local_testnet.testnet.Testnet` (what `psyche-testnet` runs)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopback import free_base_port, free_port

from coordinator import CoordinatorState
from local_testnet.client_log import client_events
from local_testnet.config_variant import write_config_variant
from local_testnet.testnet import Testnet, TestnetOptions

REPO = Path(__file__).resolve().parents[2]




def write_config(directory: Path, data_port: int, **config: int) -> Path:
    """The default local-testnet config with `[config]` overrides and an absolute data dir."""
    return write_config_variant(directory, data_port, **config)


def make_testnet(tmp_path: Path, num_clients: int, **overrides: Any) -> Testnet:
    config = overrides.pop("config", {})
    data_port = free_port()
    config_dir = write_config(tmp_path / "config", data_port, **config)
    options = TestnetOptions(num_clients=num_clients, config_path=config_dir,
                             work_dir=tmp_path / "work", server_port=free_port(),
                             metrics_base_port=free_base_port(num_clients),
                             timeout_s=overrides.pop("timeout_s", 420), **overrides)
    return Testnet(options)


async def wait_for(testnet: Testnet, condition: Callable[[CoordinatorState], bool],
                   timeout_s: float, what: str) -> CoordinatorState:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = testnet.state
        if state is not None and condition(state):
            return state
        if testnet.server is not None and testnet.server.returncode is not None:
            raise AssertionError(f"the coordinator exited ({testnet.server.returncode}) "
                                 f"while waiting for {what}")
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last state: "
                         f"{testnet.state and testnet.state.run_state.name} step "
                         f"{testnet.state and testnet.state.progress.step}")


def checkpoint_digests(work_dir: Path, client: int) -> dict[int, str]:
    """Step -> SHA-256 of the safetensors of each checkpoint this client wrote."""
    digests = {}
    for directory in (work_dir / f"client-{client}" / "checkpoints").glob("*-step*"):
        files = sorted(directory.glob("*.safetensors"))
        digest = hashlib.sha256()
        for file in files:
            digest.update(file.read_bytes())
        if files:
            digests[int(directory.name.rpartition("-step")[2])] = digest.hexdigest()
    return digests


def events(work_dir: Path, client: int, name: str) -> list[dict[str, Any]]:
    return list(client_events(work_dir, client, name))


def log_tails(work_dir: Path, lines: int = 8) -> str:
    """The last lines of the server's and every client's log: what a failed run's
    assertion message shows (CI keeps nothing else)."""
    tails = []
    for log in sorted(work_dir.glob("*.log")):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        tails.append(f"--- {log.name}\n" + "\n".join(line[:300] for line in text))
    return "\n".join(tails)
