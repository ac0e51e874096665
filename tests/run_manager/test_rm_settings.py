"""Settings from the env file: every problem named by its variable, nothing started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from solders.keypair import Keypair
from typer.testing import CliRunner

from run_manager.cli import app
from run_manager.settings import SettingsError, load_settings

runner = CliRunner()
PUBKEY = str(Keypair().pubkey())


def write_env(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.env"
    path.write_text(text)
    return path


def problems_for(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        load_settings(write_env(tmp_path, text))
    return caught.value.problems


def test_a_tcp_run_needs_only_run_id_and_coordinator(tmp_path: Path) -> None:
    settings = load_settings(write_env(tmp_path, "RUN_ID=r1\nCOORDINATOR_ADDRESS=127.0.0.1:4000\n"))
    assert settings.backend == "tcp"
    assert settings.DATA_PARALLELISM == 1 and settings.MICRO_BATCH_SIZE == 1
    env = settings.container_environment()
    assert env["RUN_ID"] == "r1" and env["COORDINATOR_ADDRESS"] == "127.0.0.1:4000"
    assert "RPC" not in env


def test_a_solana_run_with_every_variable(tmp_path: Path) -> None:
    wallet = tmp_path / "id.json"
    wallet.write_text(Keypair().to_json())
    text = (
        f"RPC=https://api.devnet.solana.com\nWS_RPC=wss://api.devnet.solana.com\n"
        f"RPC_2=http://127.0.0.1:8899\nWS_RPC_2=ws://127.0.0.1:8900\nRUN_ID=run-a\n"
        f"WALLET_PATH={wallet}\nAUTHORIZER={PUBKEY}\nDATA_PARALLELISM=1\n"
        f"TENSOR_PARALLELISM=1\nMICRO_BATCH_SIZE=8\nNVIDIA_DRIVER_CAPABILITIES=compute,utility\n"
    )
    settings = load_settings(write_env(tmp_path, text))
    assert settings.backend == "solana"
    assert wallet == settings.WALLET_PRIVATE_KEY_PATH  # WALLET_PATH accepted as an alias
    assert (settings.DATA_PARALLELISM, settings.TENSOR_PARALLELISM, settings.MICRO_BATCH_SIZE) == (1, 1, 8)
    assert settings.container_environment()["AUTHORIZER"] == PUBKEY


def test_each_malformed_value_gets_one_line_naming_it(tmp_path: Path) -> None:
    text = (
        "RUN_ID=" + "x" * 40 + "\nCOORDINATOR_ADDRESS=nowhere\nDATA_PARALLELISM=zero\n"
        "MICRO_BATCH_SIZE=0\nRPC=ftp://x\nNVIDIA_DRIVER_CAPABILITIES=compute,warp\n"
        "AUTHORIZER=0OIl\n"
    )
    problems = problems_for(tmp_path, text)
    named = sorted(p.split(":")[0] for p in problems)
    assert named == sorted([
        "RUN_ID", "COORDINATOR_ADDRESS", "DATA_PARALLELISM", "MICRO_BATCH_SIZE", "RPC",
        "NVIDIA_DRIVER_CAPABILITIES", "AUTHORIZER",
    ]), problems  # fmt: skip
    assert any("at most 32 bytes" in p for p in problems)
    assert any("warp" in p for p in problems)


def test_missing_values_are_named(tmp_path: Path) -> None:
    [problem] = problems_for(tmp_path, "COORDINATOR_ADDRESS=127.0.0.1:1\n")
    assert problem.startswith("RUN_ID: required for a TCP run, not set")
    [problem] = problems_for(tmp_path, "RUN_ID=r\n")
    assert "COORDINATOR_ADDRESS" in problem and "RPC" in problem
    # WS_RPC is not needed: it defaults from RPC (test_rm_rpc_defaults.py); the wallet is.
    [problem] = problems_for(tmp_path, "RUN_ID=r\nRPC=http://127.0.0.1:8899\n")
    assert "WALLET_PRIVATE_KEY_PATH or RAW_WALLET_PRIVATE_KEY" in problem, problem


def test_an_unreadable_wallet_file_is_named(tmp_path: Path) -> None:
    text = (
        "RUN_ID=r\nRPC=http://127.0.0.1:8899\nWS_RPC=ws://127.0.0.1:8900\n"
        f"WALLET_PRIVATE_KEY_PATH={tmp_path / 'missing.json'}\n"
    )
    [problem] = problems_for(tmp_path, text)
    assert problem.startswith("WALLET_PRIVATE_KEY_PATH: cannot read") and "no such file" in problem


def test_the_cli_prints_each_problem_and_starts_nothing(tmp_path: Path) -> None:
    env = write_env(tmp_path, "RUN_ID=\nCOORDINATOR_ADDRESS=127.0.0.1:99999\nGPUS=maybe\n")
    result = runner.invoke(app, ["--env-file", str(env), "--no-tui", "--client-version", "0.1.0"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("run-manager: ")]
    assert len(lines) == 3, result.output
    assert any("RUN_ID: required" in line for line in lines)
    assert any("COORDINATOR_ADDRESS" in line and "65535" in line for line in lines)
    assert any("GPUS" in line for line in lines)


def test_the_cli_names_a_missing_env_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["--env-file", str(tmp_path / "nope.env"), "--no-tui"])
    assert result.exit_code == 2
    assert "nope.env: no such file" in result.output


def test_a_backend_without_a_version_source_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from run_manager.runner import COORDINATOR_SOURCES

    monkeypatch.delitem(COORDINATOR_SOURCES, "solana", raising=False)
    wallet = tmp_path / "id.json"
    wallet.write_text(Keypair().to_json())
    env = write_env(tmp_path, f"RUN_ID=r\nRPC=http://127.0.0.1:8899\nWS_RPC=ws://127.0.0.1:8900\nWALLET_PATH={wallet}\n")
    result = runner.invoke(app, ["--env-file", str(env), "--no-tui"])
    assert result.exit_code == 2
    assert "cannot yet ask a solana coordinator" in result.output and "--client-version" in result.output


def test_the_solana_command_tree_is_laid_out() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("create-run", "can-join", "list-runs", "treasurer-claim-rewards",
                    "join-authorization-create", "wallet"):  # fmt: skip
        assert command in result.output, command


def test_help_and_non_tui_commands_never_import_textual(tmp_path: Path) -> None:
    env = write_env(tmp_path, "RUN_ID=\n")
    wallet = tmp_path / "id.json"
    wallet.write_text(Keypair().to_json())
    for argv in (
        ["--help"],
        ["wallet", "--help"],
        ["wallet", "show", "--wallet", str(wallet)],
        ["wallet", "new", str(tmp_path / "new.json")],
        ["create-run"],
        ["--env-file", str(env), "--no-tui"],
    ):
        probe = (
            "import sys\nfrom run_manager.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "loaded = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
            "print('TEXTUAL', loaded)\n"
        )
        result = subprocess.run([sys.executable, "-c", probe],
                                capture_output=True, check=False, text=True, timeout=60)
        assert "TEXTUAL []" in result.stdout, (argv, result.stdout, result.stderr)


def test_env_file_keys_nobody_reads_are_named() -> None:
    from run_manager.settings import unread_variables

    variables = {"RUN_ID": "r", "SERVER_ADDR": "h:1", "WALLET_PATH": "w", "IROH_RELAY": "disabled",
                 "DEVICE": "cuda", "NCCL_DEBUG": "INFO", "HF_TOKEN": "t", "GPUS": "all",
                 "COORDINATR_ADDRESS": "typo:1", "MICRO_BATCH": "4"}
    assert unread_variables(variables) == ["COORDINATR_ADDRESS", "MICRO_BATCH"]


def test_the_shell_wins_for_settings_and_the_file_feeds_client_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As in Psyche: the run-manager's own settings take the shell's value over the env
    file's (and the container gets that one); the client's other options reach the
    container from the env file, as `docker run --env-file` passes them."""
    from run_manager.settings import read_env_file

    path = write_env(tmp_path, "RUN_ID=from-file\nCOORDINATOR_ADDRESS=127.0.0.1:4000\n"
                               "IROH_RELAY=disabled\nMICRO_BATCH_SIZE=2\n")
    monkeypatch.setenv("RUN_ID", "from-shell")
    monkeypatch.setenv("MICRO_BATCH_SIZE", "8")
    monkeypatch.setenv("IROH_RELAY", "n0")
    settings = load_settings(path)
    assert settings.RUN_ID == "from-shell" and settings.MICRO_BATCH_SIZE == 8
    env = settings.container_environment(read_env_file(path))
    assert env["RUN_ID"] == "from-shell" and env["MICRO_BATCH_SIZE"] == "8"
    assert env["IROH_RELAY"] == "disabled"
