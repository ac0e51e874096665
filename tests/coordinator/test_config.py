"""state.toml / data.toml parsing: round trips, every variant, every rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomli_w
from coordinator_sim import DEV_STATE, dev_dict

from coordinator.config import (
    AdamWOptimizer,
    ConfigError,
    CosineLR,
    DistroOptimizer,
    DontShuffle,
    GcpBucket,
    GcsCheckpoint,
    HttpDataLocation,
    HubCheckpoint,
    NumberedFiles,
    P2PCheckpoint,
    SeededShuffle,
    ServerDataLocation,
    SingleUrl,
    TokenSize,
    UrlList,
    WarmupStableDecayLR,
    load_data_config,
    load_state_file,
    parse_data_config,
    parse_state_toml,
    state_file_from_dict,
)

ROOT = Path(__file__).resolve().parents[2]
DEV_DATA = ROOT / "config" / "llama2-20m-dev" / "data.toml"
FIXTURES = Path(__file__).parent / "fixtures"


def errors_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        state_file_from_dict(data)
    return info.value.errors


def test_dev_config_parses_as_the_reference_describes() -> None:
    state = load_state_file(DEV_STATE)
    assert state.run_id == "consilience-llama2-20m-fineweb"
    assert state.config.witness_nodes == 1 and state.config.total_steps == 25000
    assert state.model.checkpoint == HubCheckpoint(repo_id="emozilla/llama2-20m-init")
    assert state.model.data_location == ServerDataLocation(address="127.0.0.1:20001")
    assert isinstance(state.model.lr_schedule, CosineLR)
    assert state.model.lr_schedule.final_lr == pytest.approx(4e-5)
    assert state.model.optimizer == DistroOptimizer(
        compression_decay=0.999, compression_chunk=16, compression_topk=4, quantize_1bit=False)
    assert state.client_version == "latest"


def test_to_toml_round_trips() -> None:
    state = load_state_file(DEV_STATE)
    assert parse_state_toml(state.to_toml()) == state


def test_every_variant_round_trips() -> None:
    data = dev_dict()
    llm = data["model"]["LLM"]
    llm["checkpoint"] = {"Gcs": {"bucket": "b", "prefix": "p/"}}
    llm["lr_schedule"] = {"WarmupStableDecay": {
        "base_lr": 2e-4, "warmup_init_lr": 0.0, "cosine_decay_final_lr": 1e-5,
        "linear_decay_final_lr": 0.0, "warmup_steps": 10, "stable_steps": 100,
        "cosine_decay_steps": 50, "linear_decay_steps": 5}}
    llm["optimizer"] = {"AdamW": {"betas": [0.9, 0.95], "weight_decay": 0.1, "eps": 1e-8}}
    seeded = {"Seeded": list(range(32))}
    for location, expected in [
        ({"SingleUrl": "https://h/a.ds"}, SingleUrl(url="https://h/a.ds")),
        ({"UrlList": ["https://h/a.ds", "https://h/b.ds"]},
         UrlList(urls=["https://h/a.ds", "https://h/b.ds"])),
        ({"NumberedFiles": {"url_template": "https://h/{}.ds", "start_index": 3,
                            "n_left_pad_zeros": 5, "num_files": 2}},
         NumberedFiles(url_template="https://h/{}.ds", start_index=3, n_left_pad_zeros=5,
                       num_files=2)),
        ({"Gcp": {"bucket_name": "fineweb", "filter_directory": "edu"}},
         GcpBucket(bucket_name="fineweb", filter_directory="edu")),
    ]:
        llm["data_location"] = {"Http": {"location": location, "token_size_in_bytes": "FourBytes",
                                         "shuffle": seeded}}
        state = state_file_from_dict(data)
        http = state.model.data_location
        assert isinstance(http, HttpDataLocation)
        assert http.location == expected
        assert http.token_size_in_bytes is TokenSize.FourBytes and http.token_size_in_bytes.nbytes == 4
        assert http.shuffle == SeededShuffle(seed=bytes(range(32)))
        assert parse_state_toml(state.to_toml()) == state
    assert isinstance(state.model.optimizer, AdamWOptimizer)
    assert state.model.optimizer.betas == (0.9, 0.95)
    assert isinstance(state.model.lr_schedule, WarmupStableDecayLR)
    assert state.model.checkpoint == GcsCheckpoint(bucket="b", prefix="p/")
    for plain in ("Dummy", {"Local": "data/"}, {"WeightedHttp": "https://h/w.json"},
                  {"Preprocessed": "org/dataset"}):
        llm["data_location"] = plain
        assert parse_state_toml(state_file_from_dict(data).to_toml()) == state_file_from_dict(data)
    llm["data_location"] = {"Http": {"location": {"SingleUrl": "https://h/a"},
                                     "token_size_in_bytes": "TwoBytes", "shuffle": "DontShuffle"}}
    location = state_file_from_dict(data).model.data_location
    assert isinstance(location, HttpDataLocation) and location.shuffle == DontShuffle()


def test_saved_p2p_checkpoint_and_progress_are_accepted() -> None:
    data = dev_dict()
    data["model"]["LLM"]["checkpoint"] = {"P2P": {"repo_id": "r", "revision": "abc"}}
    data["progress"] = {"epoch": 3, "step": 40, "epoch_start_data_index": 160}
    state = state_file_from_dict(data)
    assert state.model.checkpoint == P2PCheckpoint(repo_id="r", revision="abc")
    assert state.progress is not None and state.progress.step == 40
    assert parse_state_toml(state.to_toml()) == state


def test_every_problem_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        load_state_file(FIXTURES / "bad_state.toml")
    text = "\n".join(info.value.errors)
    for expected in [
        "run_id: must be 1 to 32 bytes, got 46",
        "surprise: unknown key",
        "model.LLM.max_seq_len: Input should be greater than 0",
        "model.LLM.checkpoint: variant Ephemeral is not supported",
        "model.LLM.optimizer.Distro.compression_topk: Input should be greater than 0",
        "model.LLM.optimizer.Distro.compression_chunk: Input should be greater than 0",
        "config.cooldown_time: must be > 0",
        "config.init_min_clients: must be >= config.min_clients (2), got 1",
        "config.witness_nodes: must be <= 32, got 33",
        "config.global_batch_size_start: must be > 0",
    ]:
        assert expected in text, expected
    assert all(line.startswith(str(FIXTURES / "bad_state.toml")) for line in info.value.errors)


@pytest.mark.parametrize(("section", "key", "value", "message"), [
    ("config", "warmup_time", 60, "config.warmup_time: must be < config.epoch_time (60), got 60"),
    ("config", "max_round_train_time", 0, "config.max_round_train_time: must be > 0"),
    ("config", "max_round_train_time", 60, "config.max_round_train_time: must be > 0 and < config.epoch_time (60), got 60"),
    ("config", "round_witness_time", 0, "config.round_witness_time: must be > 0"),
    ("config", "epoch_time", 0, "config.epoch_time: must be > 0"),
    ("config", "total_steps", 0, "config.total_steps: must be > 0"),
    ("config", "min_clients", 0, "config.min_clients: must be > 0"),
    ("config", "init_min_clients", 257, "config.init_min_clients: must be <= 256 (max clients), got 257"),
    ("config", "global_batch_size_end", 3, "config.global_batch_size_end: must be >= config.global_batch_size_start (4), got 3"),
    ("config", "verification_percent", 100, "config.verification_percent: must be < 100"),
    ("config", "waiting_for_members_extra_time", 0, "config.waiting_for_members_extra_time: must be > 0"),
    ("config", "waiting_for_members_extra_time", 256, "config.waiting_for_members_extra_time: Input should be less than or equal to 255"),
    ("config", "epoch_time", "60", "config.epoch_time: Input should be a valid integer, got '60'"),
    ("config", "min_clients", True, "config.min_clients: Input should be a valid integer, got True"),
    ("config", "bogus", 1, "config.bogus: unknown key"),
    ("LLM", "cold_start_warmup_steps", 2, "model.LLM.cold_start_warmup_steps: must be <= (config.epoch_time - config.warmup_time) // config.max_round_train_time (1), got 2"),
    ("LLM", "architecture", "Gpt", "model.LLM.architecture: Input should be 'HfLlama', 'HfDeepseek', 'HfAuto' or 'Torchtitan'"),
    ("LLM", "data_type", "Chat", "model.LLM.data_type: Input should be 'Pretraining' or 'Finetuning'"),
    ("LLM", "optimizer", {"Lion": {}}, "model.LLM.optimizer: unknown variant, expected one of: Distro, AdamW, SparseLoCo, Dummy"),
    ("LLM", "data_location", {"Server": "localhost"}, 'model.LLM.data_location.Server.address: must be "host:port"'),
    ("LLM", "data_location", {"Server": "h:1", "Local": "x"}, "model.LLM.data_location: expected a variant"),
    ("LLM", "lr_schedule", {"Linear": {"base_lr": 1.0, "warmup_init_lr": 0.0, "final_lr": 0.0, "warmup_steps": 5, "total_steps": 5}}, "model.LLM.lr_schedule.Linear: total_steps must be > warmup_steps (5), got 5"),
    ("LLM", "checkpoint", {"Hub": {"repo_id": "x" * 65}}, "model.LLM.checkpoint.Hub.repo_id: must be at most 64 bytes, got 65"),
    ("top", "run_state", "RoundTrain", "run_state: Input should be 'Uninitialized', 'WaitingForMembers', 'Paused' or 'Finished'"),
    ("top", "run_id", "", "run_id: must be 1 to 32 bytes, got 0"),
])
def test_each_rule(section: str, key: str, value: Any, message: str) -> None:
    data = dev_dict()
    target = {"config": data["config"], "LLM": data["model"]["LLM"], "top": data}[section]
    target[key] = value
    errors = errors_of(data)
    assert any(error.startswith(message) for error in errors), errors


def test_http_location_rules() -> None:
    data = dev_dict()
    llm = data["model"]["LLM"]
    llm["data_location"] = {"Http": {
        "location": {"NumberedFiles": {"url_template": "https://h/{}{}.ds", "start_index": 0,
                                       "n_left_pad_zeros": 0, "num_files": 0}},
        "token_size_in_bytes": "ThreeBytes", "shuffle": {"Seeded": [1, 2, 3]}}}
    text = "\n".join(errors_of(data))
    assert 'location.NumberedFiles.url_template: must contain exactly one "{}"' in text
    assert "location.NumberedFiles.num_files: Input should be greater than 0" in text
    assert "token_size_in_bytes: expected TwoBytes or FourBytes, got 'ThreeBytes'" in text
    assert "shuffle.Seeded.seed: must have exactly 32 bytes, got 3" in text


def test_toml_syntax_error_names_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_state_toml('run_id = "a"\n[config\n')
    assert "TOML syntax error" in info.value.errors[0] and "line 2" in info.value.errors[0]


def test_missing_sections_reported() -> None:
    errors = errors_of({"run_id": "x", "run_state": "Paused"})
    assert "config: missing required key" in errors and "model: missing required key" in errors


def test_data_config(tmp_path: Path) -> None:
    parsed = load_data_config(DEV_DATA)
    assert parsed.token_size is TokenSize.TwoBytes and parsed.seq_len == 512
    assert parsed.shuffle_seed == bytes(range(1, 33))
    assert Path(parsed.dir) == (DEV_DATA.parent / "../../data/fineweb-10bt").resolve()
    bad = tomli_w.dumps({"dir": "d", "token_size": "OneByte", "seq_len": 0,
                         "shuffle_seed": [0] * 31, "extra": 1})
    with pytest.raises(ConfigError) as info:
        parse_data_config(bad, tmp_path)
    text = "\n".join(info.value.errors)
    for expected in ("token_size: expected TwoBytes or FourBytes", "seq_len: Input should be greater than 0",
                     "shuffle_seed: must have exactly 32 bytes, got 31", "extra: unknown key"):
        assert expected in text
    with pytest.raises(ConfigError, match="cannot read"):
        load_data_config(tmp_path / "missing.toml")


def test_batch_size_ramp() -> None:
    cfg = load_state_file(DEV_STATE).config.model_copy(update={
        "global_batch_size_start": 4, "global_batch_size_end": 16,
        "global_batch_size_warmup_tokens": 1000})
    # round(4 + 12 * t / 1000): 0 -> 4, 125 -> 5.5 -> 6 (half away from zero), 500 -> 10
    assert [cfg.batch_size(t) for t in (0, 125, 500, 999, 1000, 10**9)] == [4, 6, 10, 16, 16, 16]
    no_ramp = cfg.model_copy(update={"global_batch_size_warmup_tokens": 0})
    assert no_ramp.batch_size(0) == 16
