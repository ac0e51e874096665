"""Every program's command line follows the same conventions (psyche_common.cli_conventions):
`-h` is `--help`, `--version` prints "<program> <version>", help fits 80 columns uncut, and
`--help` loads neither torch nor transformers (so it stays fast however loaded the machine).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from importlib.metadata import version

import pytest
import typer
from typer.testing import CliRunner

from psyche_common.cli_conventions import psyche_tui_spelling

# program -> (module that `python -m` runs, module holding its Typer app)
PROGRAMS = {
    "psyche-coordinator": ("coordinator_tcp", "coordinator_tcp.cli"),
    "psyche-client": ("client_image.cli", "client_image.cli"),
    "psyche-train": ("client_image.training.cli", "client_image.training.cli"),
    "psyche-testnet": ("local_testnet.cli", "local_testnet.cli"),
    "run-manager": ("run_manager.cli", "run_manager.cli"),
    "psyche-localnet": ("psyche_solana.localnet", "psyche_solana.localnet"),
}
HEAVY_MODULES = ("torch", "transformers")


def _run(module: str, *args: str, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", module, *args], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": "80", "NO_COLOR": "1"})


@pytest.mark.parametrize("program", PROGRAMS)
def test_help_loads_no_heavy_module_and_h_is_help(program: str) -> None:
    module = PROGRAMS[program][0]
    long = _run(module, "--help", importtime=True)
    assert long.returncode == 0, long.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in long.stderr.splitlines()
                if line.startswith("import time:")}
    assert imported, "no -X importtime lines: the check would prove nothing"
    assert not imported & set(HEAVY_MODULES), f"{program} --help imports {HEAVY_MODULES}"
    short = _run(module, "-h")
    assert short.returncode == 0 and short.stdout == long.stdout
    assert "-h, --help" in short.stdout


@pytest.mark.parametrize("program", PROGRAMS)
def test_version_prints_the_package_version(program: str) -> None:
    result = _run(PROGRAMS[program][0], "--version")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == f"{program} {version('psyche-py')}\n"


def _command_paths(command: object, path: list[str]) -> list[list[str]]:
    paths = [path]
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            paths += _command_paths(sub, [*path, name])
    return paths


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_help_fits_80_columns_uncut(program: str) -> None:
    app = importlib.import_module(PROGRAMS[program][1]).app
    paths = _command_paths(typer.main.get_command(app), [])
    for path in paths:
        result = CliRunner().invoke(app, [*path, "-h"], prog_name=program,
                                    env={"COLUMNS": "80"})
        assert result.exit_code == 0, (path, result.output)
        for line in result.output.splitlines():
            assert len(line) <= 80, (path, line)
            # Click cuts a summary with "..." (Typer's Rich tables with "…"); usage lines
            # legitimately end in "[ARGS]...".
            assert not line.endswith("...") or "[ARGS]" in line, (path, line)
    assert len(paths) >= 1


def test_tui_is_spelled_alike_and_psyche_spelling_still_works() -> None:
    assert psyche_tui_spelling(["run", "--tui", "true", "--state", "s"]) == [
        "run", "--tui", "--state", "s"]
    assert psyche_tui_spelling(["--tui=False", "--tui", "0"]) == ["--no-tui", "--no-tui"]
    assert psyche_tui_spelling(["--tui", "maybe"]) == ["--tui", "maybe"]
    assert psyche_tui_spelling(["--", "--tui", "true"]) == ["--", "--tui", "true"]
    for program in ("psyche-coordinator", "psyche-testnet", "run-manager", "psyche-client"):
        app = importlib.import_module(PROGRAMS[program][1]).app
        command = typer.main.get_command(app)
        found = [param for cmd in [command, *getattr(command, "commands", {}).values()]
                 for param in cmd.params if "--tui" in param.opts]
        assert found and found[0].secondary_opts == ["--no-tui"], program
