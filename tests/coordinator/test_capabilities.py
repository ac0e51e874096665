"""coordinator/capabilities.py: values that parse but that our client cannot run are
refused, by `validate-config` and by `psyche-coordinator run` (docs/run-config.md,
"What this client runs")."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from typer.testing import CliRunner

from coordinator.capabilities import (
    REASONS,
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_CHECKPOINTS,
    SUPPORTED_DATA_LOCATIONS,
    SUPPORTED_DATA_TYPES,
    SUPPORTED_HTTP_LOCATIONS,
    SUPPORTED_OPTIMIZERS,
    unsupported_fields,
)
from coordinator.config import StateFile, load_state_file, state_file_from_dict
from coordinator.config_variants import CHECKPOINT, OPTIMIZER, Architecture, DataType
from coordinator.data_location import DATA_LOCATION, HTTP_LOCATION
from coordinator_tcp.cli import app

ROOT = Path(__file__).resolve().parents[2]
TESTNET = ROOT / "config" / "local-testnet" / "state.toml"
BUNDLED = sorted(ROOT.glob("config/*/state.toml"))

SEED = list(range(32))
DISTRO = {"Distro": {"compression_decay": 0.999, "compression_chunk": 16,
                     "compression_topk": 4, "quantize_1bit": False}}


def state_dict(**model: Any) -> dict[str, Any]:
    data = tomllib.loads(TESTNET.read_text())
    data["model"]["LLM"].update(model)
    return data


def state_with(**model: Any) -> StateFile:
    return state_file_from_dict(state_dict(**model))


def http(location: Any) -> dict[str, Any]:
    return {"Http": {"location": location, "token_size_in_bytes": "TwoBytes",
                     "shuffle": {"Seeded": SEED}}}


REFUSED: list[tuple[str, Any, str]] = [
    ("architecture", "Torchtitan",
     "model.LLM.architecture: Torchtitan is not supported by this client (supported: HfLlama, "
     "HfDeepseek, HfAuto): "
     "Psyche builds these models with torchtitan; the client loads only transformers models"),
    ("optimizer", {"AdamW": {"betas": [0.9, 0.95], "weight_decay": 0.0, "eps": 1e-8}},
     "model.LLM.optimizer: AdamW is not supported by this client (supported: Distro, "
     "SparseLoCo, Dummy): a networked run needs the Distro optimizer (AdamW shares nothing with "
     "peers)"),
]

SPARSELOCO = {"SparseLoCo": {"inner_steps": 2, "inner_lr": 2e-3, "topk_density": 0.02,
                             "chunk": 64, "quant_bits": 2, "error_decay": 0.95, "outer_lr": 1.0}}


def test_sparseloco_runs_with_verification_off_only() -> None:
    state = state_with(optimizer=SPARSELOCO)
    assert unsupported_fields(state) == []
    verifying = state.model_copy(update={"config": state.config.model_copy(
        update={"verification_percent": 50})})
    assert unsupported_fields(verifying) == [
        "config.verification_percent: 50 is not supported by this client with the SparseLoCo "
        "optimizer (supported: 0): verifiers replay DisTrO trainers only"]


@pytest.mark.parametrize(("key", "value", "message"), REFUSED,
                         ids=[f"{key}-{message.split(': ')[1].split()[0]}"
                              for key, _, message in REFUSED])
def test_each_unsupported_value_is_refused_with_its_message(key: str, value: Any,
                                                            message: str) -> None:
    assert unsupported_fields(state_with(**{key: value})) == [message]


ACCEPTED: list[tuple[str, Any]] = [
    ("data_type", "Finetuning"),
    ("checkpoint", {"Dummy": {"repo_id": "org/init"}}),
    ("checkpoint", {"Dummy": {"repo_id": ""}}),  # Psyche's config/test: the built-in model
    ("checkpoint", {"Hub": {"repo_id": "org/init", "revision": "r"}}),
    # A state file's P2P becomes Hub at the first warm-up (no holder of a last epoch).
    ("checkpoint", {"P2P": {"repo_id": "org/init"}}),
    ("data_location", {"Server": "127.0.0.1:20001"}),
    ("data_location", {"Local": "assets/data/train"}),
    ("data_location", "Dummy"),
    ("data_location", {"WeightedHttp": "https://example.com/mix.json"}),
    ("data_location", {"Preprocessed": "some/dataset"}),
    ("data_location", {"Preprocessed": "/data/parquet"}),
    ("data_location", http({"SingleUrl": "https://example.com/a.bin"})),
    ("data_location", http({"UrlList": ["https://example.com/a.bin"]})),
    ("data_location", http({"NumberedFiles": {"url_template": "https://example.com/{}.bin",
                                              "start_index": 0, "n_left_pad_zeros": 3,
                                              "num_files": 2}})),
    ("optimizer", DISTRO),
    ("optimizer", "Dummy"),  # Psyche's config/test: no learning
    ("lr_schedule", {"WarmupStableDecay": {
        "base_lr": 1e-3, "warmup_init_lr": 0.0, "cosine_decay_final_lr": 1e-4,
        "linear_decay_final_lr": 1e-5, "warmup_steps": 1, "stable_steps": 1,
        "cosine_decay_steps": 1, "linear_decay_steps": 1}}),
]


@pytest.mark.parametrize(("key", "value"), ACCEPTED)
def test_what_the_client_runs_is_accepted(key: str, value: Any) -> None:
    assert unsupported_fields(state_with(**{key: value})) == []


@pytest.mark.parametrize("path", BUNDLED, ids=[path.parent.name for path in BUNDLED])
def test_the_bundled_configs_pass(path: Path) -> None:
    assert unsupported_fields(load_state_file(path)) == []


def test_the_bundled_configs_are_the_expected_ones() -> None:
    assert {path.parent.name for path in BUNDLED} >= {"local-testnet", "llama2-20m-dev"}


@pytest.mark.parametrize("architecture", ["HfLlama", "HfDeepseek", "HfAuto"])
def test_every_transformers_architecture_is_accepted(architecture: str) -> None:
    # The client checks the checkpoint against it at load (training/architecture.py).
    assert unsupported_fields(state_with(architecture=architecture)) == []


def test_every_problem_is_listed_in_field_order() -> None:
    state = state_with(architecture="Torchtitan",
                       optimizer={"AdamW": {"betas": [0.9, 0.95], "weight_decay": 0.0,
                                            "eps": 1e-8}})
    keys = [line.split(":")[0] for line in unsupported_fields(state)]
    assert keys == ["model.LLM.architecture", "model.LLM.optimizer"]


def test_every_refused_variant_of_the_format_has_a_reason() -> None:
    """A variant added to the format is either supported or refused with a reason."""
    from typing import get_args

    families = [
        ("architecture", get_args(Architecture), SUPPORTED_ARCHITECTURES),
        ("data_type", get_args(DataType), SUPPORTED_DATA_TYPES),
        ("checkpoint", tuple(CHECKPOINT.variants), SUPPORTED_CHECKPOINTS),
        ("data_location", tuple(DATA_LOCATION.variants), SUPPORTED_DATA_LOCATIONS),
        ("data_location.Http.location", tuple(HTTP_LOCATION.variants), SUPPORTED_HTTP_LOCATIONS),
        ("optimizer", tuple(OPTIMIZER.variants), SUPPORTED_OPTIMIZERS),
    ]
    for key, values, supported in families:
        assert set(supported) <= set(values), key
        assert set(REASONS[key]) == set(values) - set(supported), key


# ------------------------------------------------------------------ the command line


def write_refused(tmp_path: Path) -> Path:
    path = tmp_path / "state.toml"
    path.write_text(tomli_w.dumps(state_dict(
        architecture="Torchtitan",
        optimizer={"AdamW": {"betas": [0.9, 0.95], "weight_decay": 0.0, "eps": 1e-8}})))
    return path


def test_validate_config_prints_one_line_per_problem_and_exits_1(tmp_path: Path) -> None:
    path = write_refused(tmp_path)
    result = CliRunner().invoke(app, ["validate-config", "--state", str(path)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines == [
        f"{path}: model.LLM.architecture: Torchtitan is not supported by this client (supported: "
        "HfLlama, HfDeepseek, HfAuto): Psyche builds these models with torchtitan; the client "
        "loads only transformers models",
        f"{path}: model.LLM.optimizer: AdamW is not supported by this client (supported: "
        "Distro, SparseLoCo, Dummy): a networked run needs the Distro optimizer (AdamW shares nothing "
        "with peers)",
    ]


def test_validate_config_still_says_ok_for_the_bundled_configs() -> None:
    for path in BUNDLED:
        result = CliRunner().invoke(app, ["validate-config", "--state", str(path)])
        assert result.exit_code == 0, result.output
        first, *notes = result.output.strip().splitlines()
        assert first == "OK", result.output
        # Only SparseLoCo's fields are explained (coordinator/capabilities.py, explanations).
        assert bool(notes) == ("sparseloco" in str(path)), result.output
        if notes:
            assert notes[0].startswith("optimizer SparseLoCo: each round a client runs "
                                       "inner_steps = 8 AdamW steps"), notes
            assert "26 values sent of every 32 x 32 block" in result.output


def test_run_refuses_to_start_with_the_same_lines(tmp_path: Path) -> None:
    path = write_refused(tmp_path)
    result = CliRunner().invoke(app, ["run", "--state", str(path), "--server-port", "0",
                                      "--bind-host", "127.0.0.1"])
    assert result.exit_code == 1
    problems = [line for line in result.output.splitlines() if "is not supported" in line]
    assert [line.split(": ")[1] for line in problems] == [
        "model.LLM.architecture", "model.LLM.optimizer"]
    assert all(line.startswith(f"{path}: ") for line in problems)
    assert "listening" not in result.output
