"""Psyche's env-file keys and forms: accepted, ignored with a warning naming them, or refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from solders.keypair import Keypair
from typer.testing import CliRunner

from run_manager.cli import app
from run_manager.psyche_env import IGNORED, REFUSED
from run_manager.runner import RunOptions, supervisor_config
from run_manager.settings import SettingsError, env_file_warnings, load_settings

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
SOLANA = "RPC=http://127.0.0.1:8899\nWS_RPC=ws://127.0.0.1:8900\n"


def load(tmp_path: Path, text: str):
    path = tmp_path / "run.env"
    path.write_text(text)
    return load_settings(path)


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        load(tmp_path, text)
    return caught.value.problems


@pytest.mark.parametrize("form", ["base58", "json"])
def test_raw_wallet_private_key_in_either_of_psyches_forms_is_the_wallet(tmp_path: Path, form: str) -> None:
    keypair = Keypair()
    raw = str(keypair) if form == "base58" else keypair.to_json()
    settings = load(tmp_path, f"{SOLANA}RUN_ID=r\nRAW_WALLET_PRIVATE_KEY={raw}\n")
    assert settings.wallet_bytes() == bytes(keypair)
    environment = supervisor_config(settings, RunOptions()).environment
    # The container always gets the JSON array (our client reads both forms).
    assert json.loads(environment["RAW_WALLET_PRIVATE_KEY"]) == list(bytes(keypair))
    assert str(keypair) not in repr(settings)  # the key stays out of reprs and logs


def test_raw_wallet_private_key_wins_over_the_file_as_in_psyche_and_says_so(tmp_path: Path) -> None:
    raw, file_key = Keypair(), Keypair()
    wallet = tmp_path / "id.json"
    wallet.write_text(file_key.to_json())
    settings = load(tmp_path, f"{SOLANA}RUN_ID=r\nRAW_WALLET_PRIVATE_KEY={raw}\n"
                              f"WALLET_PRIVATE_KEY_PATH={wallet}\n")
    assert settings.wallet_bytes() == bytes(raw)
    [warning] = env_file_warnings({}, settings)
    assert "RAW_WALLET_PRIVATE_KEY and WALLET_PRIVATE_KEY_PATH are both set" in warning


@pytest.mark.parametrize(("value", "expected"), [
    ("[1, 2, 3]", "not a solana-keygen keypair"),
    ("3xyz", "decodes to 3 bytes; a base58 keypair is 64"),
    ("not a key!", "neither a JSON array of 64 bytes (solana-keygen) nor a base58 keypair"),
    (str(Keypair().pubkey()), "decodes to 32 bytes"),
])
def test_a_bad_raw_wallet_key_is_one_line_that_does_not_echo_it(tmp_path: Path, value: str,
                                                                 expected: str) -> None:
    [problem] = problems(tmp_path, f"{SOLANA}RUN_ID=r\nRAW_WALLET_PRIVATE_KEY={value}\n")
    assert problem.startswith("RAW_WALLET_PRIVATE_KEY: ") and expected in problem
    assert value not in problem


def test_a_solana_run_needs_a_wallet_in_one_of_the_two_forms(tmp_path: Path) -> None:
    [problem] = problems(tmp_path, f"{SOLANA}RUN_ID=r\n")
    assert problem.startswith("WALLET_PRIVATE_KEY_PATH or RAW_WALLET_PRIVATE_KEY: one is required")


def test_run_id_may_be_left_out_on_solana_only(tmp_path: Path) -> None:
    settings = load(tmp_path, f"{SOLANA}RAW_WALLET_PRIVATE_KEY={Keypair()}\n")
    assert settings.RUN_ID is None  # the run-manager picks one (run_manager.discovery)
    with pytest.raises(SettingsError, match="no run was picked"):
        _ = settings.run_id
    [problem] = problems(tmp_path, "COORDINATOR_ADDRESS=127.0.0.1:1\n")
    assert problem.startswith("RUN_ID: required for a TCP run") and "Solana" in problem
    # With both backends named, COORDINATOR_ADDRESS wins (a TCP run): RUN_ID is needed.
    [problem] = problems(tmp_path, f"{SOLANA}COORDINATOR_ADDRESS=127.0.0.1:1\n"
                                   f"RAW_WALLET_PRIVATE_KEY={Keypair()}\n")
    assert problem.startswith("RUN_ID: required for a TCP run")


@pytest.mark.parametrize(("text", "expected"), [
    ("DATA_PARALLELISM=0\n", "DATA_PARALLELISM: Input should be greater than or equal to 1"),
    ("TENSOR_PARALLELISM=-2\n", "TENSOR_PARALLELISM: Input should be greater than or equal to 1"),
    ("PSYCHE_MAIN_HOST=10.0.0.1\n", "PSYCHE_MAIN_HOST: refused: Psyche's container then runs as a multi-node sidecar"),
])
def test_what_psyche_does_and_we_cannot_is_refused_by_name(tmp_path: Path, text: str, expected: str) -> None:
    [problem] = problems(tmp_path, f"RUN_ID=r\nCOORDINATOR_ADDRESS=127.0.0.1:1\n{text}")
    assert problem.startswith(expected), problem


def test_psyches_keys_we_do_not_use_are_named_in_warnings_never_dropped_silently() -> None:
    variables = {"RUN_ID": "r", "RPC_3": "http://h", "WANDB_API_KEY": "k", "EVAL_TASKS": "hellaswag",
                 "OPTIM_STATS_STEPS": "10",
                 "WALLET_FILE": "~/id.json", "BLOBS_GC_INTERVAL_MILLIS": "500", "MICRO_BATCH": "4",
                 "PSYCHE_COORDINATOR_PROGRAM_ID": str(Keypair().pubkey()), "RUST_LOG": "debug",
                 "RAW_WALLET_PRIVATE_KEY": "x", "SCRATCH_DIR": "/tmp", "AUTHORIZER": "a"}
    warnings = env_file_warnings(variables)
    named = sorted(line.split(" ")[0] for line in warnings)
    # RPC_3 is used (the third RPC endpoint); WANDB_API_KEY is read by wandb in the client
    assert named == ["BLOBS_GC_INTERVAL_MILLIS", "MICRO_BATCH", "OPTIM_STATS_STEPS",
                     "WALLET_FILE"]
    assert ("OPTIM_STATS_STEPS is read by Psyche (optimizer statistics), not by psyche-py: "
            "ignored") in warnings
    assert "MICRO_BATCH is read by neither the run-manager nor the client (a typo?)" in warnings


def test_the_cli_names_each_ignored_key_then_goes_on(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from run_manager import engine

    def no_engine(timeout_s: float = 30.0) -> None:
        raise engine.EngineError("no engine in this test")

    monkeypatch.setattr(engine, "connect", no_engine)  # stop right after the settings
    env = tmp_path / "run.env"
    env.write_text("RUN_ID=r\nCOORDINATOR_ADDRESS=127.0.0.1:1\nOPTIM_STATS_STEPS=10\n"
                   "HUB_MAX_CONCURRENT_DOWNLOADS=4\nGCS_BUCKET=b\nWANDB_PROJECT=p\n")
    result = runner.invoke(app, ["--env-file", str(env), "--no-tui", "--client-version", "1"])
    assert result.exit_code == 1 and "no engine in this test" in result.output
    for key in ("OPTIM_STATS_STEPS", "HUB_MAX_CONCURRENT_DOWNLOADS"):
        assert f"run-manager: warning: {env}: {key} is read by Psyche (" in result.output
    assert "GCS_BUCKET" not in result.output  # the client's --gcs-bucket reads it
    assert "WANDB_PROJECT" not in result.output  # the client's --wandb-project reads it
    assert "Traceback" not in result.output

    env.write_text("RUN_ID=r\nCOORDINATOR_ADDRESS=127.0.0.1:1\nDATA_PARALLELISM=0\n")
    result = runner.invoke(app, ["--env-file", str(env), "--no-tui", "--client-version", "1"])
    assert result.exit_code == 2
    assert result.output.strip().startswith(
        "run-manager: DATA_PARALLELISM: Input should be greater than or equal to 1")


@pytest.mark.parametrize("flag", ["--authorizer", "--coordinator-program-id"])
def test_psyches_docker_mode_flags_take_public_keys(tmp_path: Path, flag: str) -> None:
    env = tmp_path / "run.env"
    env.write_text("RUN_ID=r\nCOORDINATOR_ADDRESS=127.0.0.1:1\n")
    result = runner.invoke(app, ["--env-file", str(env), "--no-tui", flag, "not-a-key"])
    assert result.exit_code == 2
    assert result.output.strip() == f"run-manager: {flag}: not a base58 public key: 'not-a-key'"


def test_local_means_never_pull_and_the_program_id_reaches_the_client(tmp_path: Path) -> None:
    settings = load(tmp_path, f"{SOLANA}RUN_ID=r\nRAW_WALLET_PRIVATE_KEY={Keypair()}\n")
    program = str(Keypair().pubkey())
    config = supervisor_config(settings, RunOptions(local=True, coordinator_program_id=program))
    assert config.pull is False
    assert config.environment["PSYCHE_COORDINATOR_PROGRAM_ID"] == program
    assert supervisor_config(settings, RunOptions()).pull is True


def test_local_refuses_to_pull_a_missing_image() -> None:
    import docker

    from run_manager import engine

    class Images:
        def get(self, image: str) -> None:
            raise docker.errors.ImageNotFound(image)

    class Client:
        images = Images()

        @property
        def api(self) -> None:
            raise AssertionError("--local must not pull")

    with pytest.raises(engine.ImageUnavailableError, match="--local forbids pulling it"):
        engine.ensure_image(Client(), "psyche-client:9.9", pull=False)


def test_the_operators_guide_env_table_lists_every_ignored_and_refused_key() -> None:
    guide = (REPO / "docs" / "operators.md").read_text()
    table = guide[guide.index("| Psyche's env key"):]
    rows = [line.split("|")[1:3] for line in table[:table.index("\n\n")].splitlines()[2:]]

    def keys(group: str) -> set[str]:
        return {key for names, what in rows if what.strip().startswith(group)
                for key in re.findall(r"`([A-Z0-9_]+)`", names)}

    assert keys("ignored") == set(IGNORED)
    assert set(REFUSED) == keys("refused")
    assert {"DATA_PARALLELISM", "TENSOR_PARALLELISM"} <= keys("used")
