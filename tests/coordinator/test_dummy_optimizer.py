"""Psyche's `optimizer = "Dummy"` (its config/test): it parses, round-trips through the
TOML, the coordinator's binary state and the Solana program's account, passes
validate-config, and is refused with verification on."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from coordinator import Coordinator, decode_state, encode_state
from coordinator.capabilities import unsupported_fields
from coordinator.config import (
    ConfigError,
    DummyCheckpoint,
    DummyDataLocation,
    DummyOptimizer,
    load_state_file,
    parse_state_toml,
)
from coordinator_tcp.cli import app

PSYCHE_TEST = Path(__file__).parent / "fixtures" / "psyche_config_test_state.toml"


def test_psyches_config_test_loads_with_the_dummy_optimizer() -> None:
    state = load_state_file(PSYCHE_TEST)
    assert state.model.optimizer == DummyOptimizer()
    assert state.model.checkpoint == DummyCheckpoint(repo_id="")
    assert state.model.data_location == DummyDataLocation()
    assert unsupported_fields(state) == []
    # Written back as Psyche writes a unit variant: a bare string.
    assert 'optimizer = "Dummy"' in state.to_toml()
    assert parse_state_toml(state.to_toml()) == state


def test_psyches_config_test_passes_validate_config() -> None:
    result = CliRunner().invoke(app, ["validate-config", "--state", str(PSYCHE_TEST)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "OK"


def test_the_coordinator_state_round_trips_the_dummy_optimizer() -> None:
    state = Coordinator.from_state_file(load_state_file(PSYCHE_TEST)).state
    decoded = decode_state(encode_state(state))
    assert decoded.model.optimizer == DummyOptimizer()
    assert decoded == state


def test_the_solana_program_stores_the_dummy_optimizer() -> None:
    from psyche_solana.scenario import SvmRun

    state_file = load_state_file(PSYCHE_TEST)
    on_chain = SvmRun.create(state_file).account().state
    assert on_chain is not None
    assert on_chain.model.optimizer == DummyOptimizer()
    assert on_chain.model == state_file.model


def test_verification_is_refused_with_the_dummy_optimizer() -> None:
    state = load_state_file(PSYCHE_TEST)
    verifying = state.model_copy(update={"config": state.config.model_copy(
        update={"verification_percent": 50})})
    assert unsupported_fields(verifying) == [
        "config.verification_percent: 50 is not supported by this client with the Dummy "
        "optimizer (supported: 0): verifiers replay DisTrO trainers only (a Dummy step "
        "computes nothing to compare with)"]


@pytest.mark.parametrize(("written", "message"), [
    ('optimizer = { Dummy = { delay = 1 } }',
     "model.LLM.optimizer.Dummy.delay: unknown key"),
    ('optimizer = "Dumy"',
     "model.LLM.optimizer: unknown variant, expected one of: Distro, AdamW, SparseLoCo, Dummy"),
])
def test_a_bad_dummy_optimizer_is_one_line(tmp_path: Path, written: str, message: str) -> None:
    path = tmp_path / "state.toml"
    path.write_text(PSYCHE_TEST.read_text().replace('optimizer = "Dummy"', written))
    with pytest.raises(ConfigError) as caught:
        load_state_file(path)
    assert any(message in error for error in caught.value.errors), caught.value.errors
    result = CliRunner().invoke(app, ["validate-config", "--state", str(path)])
    assert result.exit_code != 0 and message in result.output
    assert "Traceback" not in result.output
