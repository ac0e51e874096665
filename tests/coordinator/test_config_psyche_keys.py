"""Unknown keys in a run config: Psyche ignores them, we refuse them and say so; the keys
that Psyche's own files carry (its config/ directory, its server's saved states) are
accepted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomli_w
from coordinator_sim import dev_dict

from coordinator.config import (
    ConfigError,
    WarmupStableDecayLR,
    WeightedHttpDataLocation,
    parse_data_config,
    parse_state_toml,
    state_file_from_dict,
)

PSYCHE = "(Psyche ignores unknown keys; psyche-py refuses them so that a misspelt key is not silently dropped)"


def errors_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        state_file_from_dict(data)
    return info.value.errors


@pytest.mark.parametrize(("where", "key"), [
    ((), "surprise"), (("config",), "witness_node"), (("model", "LLM"), "max_seq_length"),
    (("model", "LLM", "optimizer", "Distro"), "compression_top_k"),
])
def test_an_unknown_key_is_refused_and_the_message_names_psyches_behaviour(
        where: tuple[str, ...], key: str) -> None:
    data = dev_dict()
    table = data
    for part in where:
        table = table[part]
    table[key] = 1
    assert errors_of(data) == [".".join((*where, key)) + f": unknown key {PSYCHE}"]


def test_data_toml_unknown_keys_name_psyches_behaviour_too(tmp_path: Path) -> None:
    text = tomli_w.dumps({"dir": "d", "token_size": "TwoBytes", "seq_len": 8,
                          "shuffle_seed": list(range(32)), "sequence_length": 8})
    with pytest.raises(ConfigError) as info:
        parse_data_config(text, tmp_path)
    assert info.value.errors == [f"sequence_length: unknown key {PSYCHE}"]


def psyche_saved_state() -> dict[str, Any]:
    """What Psyche's server writes with --save-state-dir (its whole Coordinator, serde):
    the run's config plus its runtime fields, here with our own values."""
    data = dev_dict()
    data["progress"] = {"epoch": 4, "step": 81, "epoch_start_data_index": 320}
    data["epoch_state"] = {
        "rounds": [{"witnesses": [], "data_index": 0, "random_seed": 0, "height": 0,
                    "clients_len": 0, "tie_breaker_tasks": 0}] * 4,
        "clients": [], "exited_clients": [], "rounds_head": 0, "start_step": 61,
        "last_step": 0, "start_timestamp": 1_760_000_000, "first_round": 1,
        "cold_start_epoch": 0}
    data["run_state_start_unix_timestamp"] = 1_760_000_123
    data["pending_pause"] = 0  # Psyche's SmallBoolean is a u8
    return data


def test_a_psyche_saved_state_is_accepted_and_its_runtime_keys_are_not_used() -> None:
    saved = state_file_from_dict(psyche_saved_state())
    assert saved.progress is not None and saved.progress.step == 81
    plain = {k: v for k, v in psyche_saved_state().items()
             if k not in ("epoch_state", "run_state_start_unix_timestamp", "pending_pause")}
    assert saved.model_dump() == state_file_from_dict(plain).model_dump()
    text = saved.to_toml()  # what we write back holds only what we use
    assert "epoch_state" not in text and "pending_pause" not in text
    assert parse_state_toml(text).progress == saved.progress


def test_psyches_runtime_keys_are_still_type_checked() -> None:
    data = psyche_saved_state()
    data["pending_pause"] = "yes"
    data["run_state_start_unix_timestamp"] = -1
    data["epoch_state"] = 3
    errors = errors_of(data)
    assert "pending_pause: Input should be a valid integer, got 'yes'" in errors
    assert any(e.startswith("run_state_start_unix_timestamp: Input should be greater than or equal to 0")
               for e in errors)
    assert any(e.startswith("epoch_state: Input should be a valid dictionary") for e in errors)


def test_the_key_shapes_of_psyches_config_directory_parse() -> None:
    """Psyche's config/*/state.toml use, beyond the dev config's keys: a WeightedHttp URL,
    WarmupStableDecay, Distro with weight_decay and clip_grad_norm, a Hub revision, a Dummy
    checkpoint with a repo_id, Dummy data."""
    data = dev_dict()
    llm = data["model"]["LLM"]
    llm["data_location"] = {"WeightedHttp": "https://example.org/mix.json"}
    llm["lr_schedule"] = {"WarmupStableDecay": {
        "warmup_steps": 20, "warmup_init_lr": 0.0, "base_lr": 2.0e-4, "stable_steps": 100,
        "cosine_decay_steps": 50, "cosine_decay_final_lr": 2.0e-5, "linear_decay_steps": 10,
        "linear_decay_final_lr": 2.0e-5}}
    llm["optimizer"]["Distro"].update({"weight_decay": 0.1, "clip_grad_norm": 1.0})
    llm["checkpoint"] = {"Hub": {"repo_id": "org/model", "revision": "0123abcd"}}
    state = state_file_from_dict(data)
    assert isinstance(state.model.data_location, WeightedHttpDataLocation)
    assert isinstance(state.model.lr_schedule, WarmupStableDecayLR)
    llm["data_location"] = "Dummy"
    llm["checkpoint"] = {"Dummy": {"repo_id": "org/model"}}
    state_file_from_dict(data)
