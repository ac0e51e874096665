"""`psyche-coordinator`: the coordinator's command line.

    psyche-coordinator validate-config --state state.toml [--data-config data.toml]

prints `OK` or every problem (one per line) and exits 1 on error. The `run`
subcommand (the TCP server) is registered on the same `app` by its module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from coordinator.config import ConfigError, load_data_config, load_state_file

app = typer.Typer(help="Psyche coordinator (TCP backend).", no_args_is_help=True,
                  add_completion=False)


@app.command("validate-config")
def validate_config(
    state: Annotated[Path, typer.Option("--state", help="the run's state.toml")],
    data_config: Annotated[Path | None, typer.Option(
        "--data-config", help="data.toml of the TCP data server")] = None,
) -> None:
    """Check a run configuration; print OK or every error."""
    errors: list[str] = []
    try:
        load_state_file(state)
    except ConfigError as exc:
        errors += exc.errors
    if data_config is not None:
        try:
            load_data_config(data_config)
        except ConfigError as exc:
            errors += exc.errors
    if errors:
        for line in errors:
            typer.echo(line, err=True)
        raise typer.Exit(code=1)
    typer.echo("OK")


@app.callback()
def _root() -> None:
    """Keeps `validate-config` a subcommand even while it is the only one."""


def main() -> None:
    app()
