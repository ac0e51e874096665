"""Helpers for the run-manager's TCP tests: the local-testnet run with short times."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from coordinator.config import StateFile, state_file_from_dict

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTNET = REPO_ROOT / "config" / "local-testnet"
RUN_ID = "local-testnet"


def testnet_state(
    client_version: str = "0.1.0", data_port: int = 20001, run_id: str = RUN_ID, **config: Any
) -> dict[str, Any]:
    """The local-testnet state.toml as a dict: one client is enough, short phases."""
    data = tomllib.loads((TESTNET / "state.toml").read_text())
    data["client_version"] = client_version
    data["run_id"] = run_id
    data["config"].update({
        "init_min_clients": 1, "min_clients": 1, "warmup_time": 20,
        "waiting_for_members_extra_time": 1, "max_round_train_time": 10,
        "round_witness_time": 1, "cooldown_time": 2, "epoch_time": 600,
        "total_steps": 1000,
    })  # fmt: skip
    data["config"].update(config)
    data["model"]["LLM"]["data_location"] = {"Server": f"127.0.0.1:{data_port}"}
    data["model"]["LLM"]["lr_schedule"]["Cosine"]["total_steps"] = data["config"]["total_steps"]
    return data


def state_file(client_version: str = "0.1.0", **config: Any) -> StateFile:
    return state_file_from_dict(testnet_state(client_version, **config))


def write_run_files(
    directory: Path, client_version: str, data_port: int, run_id: str = RUN_ID
) -> tuple[Path, Path]:
    """state.toml and data.toml (data dir made absolute) for `psyche-coordinator run`."""
    directory.mkdir(parents=True, exist_ok=True)
    state_path = directory / "state.toml"
    state_path.write_text(tomli_w.dumps(testnet_state(client_version, data_port, run_id)))
    data = tomllib.loads((TESTNET / "data.toml").read_text())
    data["dir"] = str((TESTNET / data["dir"]).resolve())
    data_path = directory / "data.toml"
    data_path.write_text(tomli_w.dumps(data))
    return state_path, data_path


