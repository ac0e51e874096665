"""What `psyche-client train`'s options make of flags and environment variables, for the
tests of one option each: the ClientConfig they build, and the one-line usage error a bad
value must give (exit 2, the option named, no traceback)."""

from __future__ import annotations

from typing import Any

import typer
from typer.testing import CliRunner

from client_image.cli import app
from client_image.client_config import ClientConfig
from client_image.config_typer import client_config_options

TRAIN_ARGS = ["train", "--run-id", "r", "--server-addr", "127.0.0.1:9", "--logs", "none"]


def config_from(args: list[str], env: dict[str, str]) -> ClientConfig:
    """The ClientConfig `train`'s options make of these flags and variables."""
    probe = typer.Typer()
    seen: list[ClientConfig] = []

    @probe.command()
    @client_config_options
    def train(config: ClientConfig) -> None:
        seen.append(config)

    result = CliRunner().invoke(probe, ["--run-id", "r", *args], env=env)
    assert result.exit_code == 0, result.output
    return seen[0]


def one_line_usage_error(args: list[str], env: dict[str, Any], option: str, message: str,
                         marker: str = "Error:") -> None:
    """The real `train` with these flags and variables exits 2 with one line holding
    `marker` (our own errors start with "Error:", Typer's own choice errors say "Invalid
    value") that names `option` and says `message`, and no traceback."""
    result = CliRunner().invoke(app, [*TRAIN_ARGS, *args], env={"COLUMNS": "200", **env})
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if marker in line]
    assert len(errors) == 1 and option in errors[0], result.output
    assert message in errors[0], result.output
    assert "Traceback" not in result.output
