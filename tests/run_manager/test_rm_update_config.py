"""`update-config --config-path` reads [config] and [model] only, as Psyche's does: files
shaped like Psyche's config/solana-test/*.toml (no run_id, no run_state) are accepted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomli_w
from typer.testing import CliRunner

from coordinator import ConfigError
from coordinator.config import GcsCheckpoint, HttpDataLocation, HubCheckpoint
from run_manager.cli import app
from run_manager.commands.solana_config import load_run_config

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]

CONFIG = {
    "warmup_time": 20, "cooldown_time": 20, "epoch_time": 90, "max_round_train_time": 20,
    "round_witness_time": 2, "min_clients": 1, "init_min_clients": 1, "verification_percent": 0,
    "witness_nodes": 0, "global_batch_size_start": 16, "global_batch_size_end": 16,
    "global_batch_size_warmup_tokens": 0, "total_steps": 1000, "waiting_for_members_extra_time": 3,
}
GCP = {"Gcp": {"bucket_name": "some-bucket", "filter_directory": "tokens"}}
SINGLE_URL = {"SingleUrl": "https://example.org/data/000.ds"}


def solana_test_config(checkpoint: dict[str, Any], location: dict[str, Any],
                       quantize_1bit: bool) -> dict[str, Any]:
    """The keys of Psyche's solana-test configs (config.toml, light-config.toml,
    light-config-gcs.toml, nano-config.toml), with our own values."""
    return {"config": CONFIG, "model": {"LLM": {
        "architecture": "HfLlama", "data_type": "Pretraining", "max_seq_len": 256,
        "cold_start_warmup_steps": 0, "checkpoint": checkpoint,
        "data_location": {"Http": {"token_size_in_bytes": "TwoBytes", "shuffle": "DontShuffle",
                                   "location": location}},
        "lr_schedule": {"Cosine": {"base_lr": 3.0e-4, "warmup_steps": 10, "warmup_init_lr": 0.0,
                                   "total_steps": 1000, "final_lr": 3.0e-5}},
        "optimizer": {"Distro": {"clip_grad_norm": 1.0, "compression_decay": 0.999,
                                 "compression_chunk": 64, "compression_topk": 8,
                                 "quantize_1bit": quantize_1bit}}}}}


SHAPES = {
    "config": solana_test_config({"Hub": {"repo_id": "org/init"}}, GCP, False),
    "light-config": solana_test_config({"Hub": {"repo_id": "org/init"}}, GCP, True),
    "light-config-gcs": solana_test_config({"Gcs": {"bucket": "init-bucket"}}, GCP, True),
    "nano-config": solana_test_config({"Hub": {"repo_id": "org/nano", "revision": "abc123"}},
                                      SINGLE_URL, True),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_psyches_solana_test_config_shapes_are_accepted(tmp_path: Path, shape: str) -> None:
    path = tmp_path / f"{shape}.toml"
    path.write_text(tomli_w.dumps(SHAPES[shape]))
    update = load_run_config(path, "my-run", None)
    assert update.config.total_steps == 1000 and update.notes == []
    assert isinstance(update.model.data_location, HttpDataLocation)
    assert isinstance(update.model.checkpoint, GcsCheckpoint if "gcs" in shape else HubCheckpoint)


def test_a_full_state_file_still_works_and_unused_keys_are_noted(tmp_path: Path) -> None:
    update = load_run_config(REPO / "config/local-testnet/state.toml", "local-testnet", None)
    assert update.notes == []
    data = {**SHAPES["config"], "run_id": "elsewhere", "run_state": "WaitingForMembers",
            "client_version": "v9", "progress": {"epoch": 1, "step": 5, "epoch_start_data_index": 0}}
    path = tmp_path / "state.toml"
    path.write_text(tomli_w.dumps(data))
    notes = load_run_config(path, "my-run", None).notes
    assert any("names run_id 'elsewhere'; it is not used: this updates run 'my-run'" in n for n in notes)
    assert any("[progress] is not applied" in n for n in notes)
    assert any("client_version is not applied: pass --client-version" in n for n in notes)
    assert len(load_run_config(path, "elsewhere", "v9").notes) == 1  # only progress is left


def test_unknown_keys_are_still_refused_naming_psyches_behaviour(tmp_path: Path) -> None:
    data = SHAPES["config"]
    path = tmp_path / "typo.toml"
    path.write_text(tomli_w.dumps({**data, "config": {**CONFIG, "witness_node": 1}, "extra": 1}))
    with pytest.raises(ConfigError) as caught:
        load_run_config(path, "r", None)
    assert sorted(caught.value.errors) == sorted([
        f"{path}: config.witness_node: unknown key (Psyche ignores unknown keys; psyche-py "
        "refuses them so that a misspelt key is not silently dropped)",
        f"{path}: extra: unknown key (Psyche ignores unknown keys; psyche-py refuses them so "
        "that a misspelt key is not silently dropped)",
    ])


@pytest.mark.parametrize(("text", "expected"), [
    ("[config\n", "TOML syntax error"),
    ("[config]\nwarmup_time = 1\n", "model: missing required key"),
    (None, "cannot read"),
])
def test_bad_files_are_one_line_per_problem_without_a_traceback(tmp_path: Path, text: str | None,
                                                                expected: str) -> None:
    path = tmp_path / "bad.toml"
    if text is not None:
        path.write_text(text)
    result = runner.invoke(app, ["update-config", "-r", "r", "--config-path", str(path)],
                           env={"RAW_WALLET_PRIVATE_KEY": str(_keypair())})
    assert result.exit_code == 2, result.output
    assert expected in result.output and "Traceback" not in result.output
    assert all(line.startswith(("run-manager: invalid config", str(path)))
               for line in result.output.strip().splitlines())


def _keypair() -> Any:
    from solders.keypair import Keypair

    return Keypair()
