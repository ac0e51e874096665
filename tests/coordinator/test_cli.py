"""`psyche-coordinator validate-config`, in process and as the console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from coordinator_tcp.cli import app

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "config" / "llama2-20m-dev"
TESTNET = ROOT / "config" / "local-testnet"
BAD = Path(__file__).parent / "fixtures" / "bad_state.toml"


def test_valid_config_prints_ok() -> None:
    result = CliRunner().invoke(app, ["validate-config", "--state", str(TESTNET / "state.toml"),
                                      "--data-config", str(TESTNET / "data.toml")])
    assert result.exit_code == 0 and result.output.strip() == "OK"


def test_a_data_directory_the_server_cannot_serve_is_an_error(tmp_path: Path) -> None:
    """validate-config checks what `run` will serve: an empty or truncated data directory
    is named, not found by a crash at start-up; a missing one too with --strict."""
    empty, short = tmp_path / "empty", tmp_path / "short"
    empty.mkdir()
    short.mkdir()
    (short / "a.bin").write_bytes(b"\x01" * 7)  # 3.5 two-byte tokens
    seed = ", ".join(["1"] * 32)
    for directory, message, strict in ((tmp_path / "none", "does not exist", ["--strict"]),
                                       (empty, "has no token files", []),
                                       (short, "not a whole number of 2-byte tokens", [])):
        data = tmp_path / "data.toml"
        data.write_text(f'dir = "{directory}"\ntoken_size = "TwoBytes"\nseq_len = 128\n'
                        f"shuffle_seed = [{seed}]\n")
        result = CliRunner().invoke(app, ["validate-config", "--state",
                                          str(TESTNET / "state.toml"), "--data-config", str(data),
                                          *strict])
        assert result.exit_code == 1, result.output
        assert f"{data}: dir: " in result.output and message in result.output
    result = CliRunner().invoke(app, ["validate-config", "--state", str(DEV / "state.toml"),
                                      "--data-config", str(DEV / "data.toml"), "--strict"])
    assert result.exit_code == 1 and "fineweb-10bt does not exist" in result.output


def test_a_data_directory_missing_here_is_a_warning_as_psyche_accepts_it() -> None:
    # Psyche's dev config names a data set this checkout does not ship; the data server
    # that serves it may run on another machine than the one validating: OK, with a warning.
    result = CliRunner().invoke(app, ["validate-config", "--state", str(DEV / "state.toml"),
                                      "--data-config", str(DEV / "data.toml")])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(f"warning: {DEV / 'data.toml'}: dir ")
    assert "fineweb-10bt does not exist on this machine" in lines[0] and "--strict" in lines[0]
    assert "OK" in lines[1:]


def test_invalid_config_prints_every_error(tmp_path: Path) -> None:
    data = tmp_path / "data.toml"
    data.write_text('dir = "d"\ntoken_size = "TwoBytes"\nseq_len = 0\nshuffle_seed = [1]\n')
    result = CliRunner().invoke(app, ["validate-config", "--state", str(BAD),
                                      "--data-config", str(data)])
    assert result.exit_code == 1
    assert "config.init_min_clients: must be >= config.min_clients (2), got 1" in result.output
    assert "config.witness_nodes: must be <= 32, got 33" in result.output
    assert "seq_len: Input should be greater than 0" in result.output
    assert "OK" not in result.output


def test_missing_file_is_an_error_not_a_crash(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate-config", "--state", str(tmp_path / "none.toml")])
    assert result.exit_code == 1 and "cannot read" in result.output


def test_module_entry_point_runs() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", "from coordinator_tcp.cli import main; main()", "validate-config",
         "--state", str(DEV / "state.toml")],
        capture_output=True, check=False, text=True, timeout=60, cwd=ROOT)
    assert completed.returncode == 0 and completed.stdout.strip() == "OK"


def test_benchmark_smoke() -> None:
    completed = subprocess.run([sys.executable, "-m", "bench.coordinator_machine",
                                "--rounds", "3"],
                               capture_output=True, check=False, text=True, timeout=120, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr
    import json

    figures = json.loads(completed.stdout.strip().splitlines()[-1])
    assert figures["ticks_per_s"] > 0 and figures["witness_msgs_per_s"] > 0
