"""`psyche-coordinator`: the coordinator's command line.

    psyche-coordinator validate-config --state state.toml [--data-config data.toml]

prints `OK` or every problem (one per line) and exits 1 on error: the syntax and rules of
the files, then, for a valid state file, every field value this implementation's client
cannot run (coordinator/capabilities.py), e.g. `state.toml: model.LLM.architecture:
HfAuto is not supported by this client (supported: HfLlama): ...`.

    psyche-coordinator run --state state.toml [--server-port 20000] [--data-config data.toml]
        [--save-state-dir D] [--withdraw-on-disconnect true|false] [--init-warmup-time S]
        [--tui | --no-tui] [--tick-interval 0.5] [--bind-host 0.0.0.0] [--accept-model-loss]
        [--no-checkpoint-history-check] [--events-dir DIR]
        [--prometheus-port P] [--otlp-metrics-url URL] ... (psyche_common.telemetry.options)

runs the TCP coordinator (and the TCP data server when the run's data location is
`Server`) until SIGINT, SIGTERM or SIGHUP (or q / ctrl+c / ctrl+q in the TUI): it says
"stopping…", closes every connection and both servers, saves the state (with
--save-state-dir) and exits 0 (a requested stop is a server's normal end). The same
config errors as validate-config (a value the client cannot run included) exit 1, and so
does a port that is in use, at once, with one line such as `error: port 20000 is in use:
cannot listen on 0.0.0.0:20000 (--server-port)`. Logs go to stderr (to the TUI's log panel
with --tui). Psyche's spelling `--tui true|false` still works (psyche_common.cli_conventions).

A run whose model is lost (no client that held it came back, no upload as new was
reported: the state's model_lost, "MODEL LOST" in the TUIs) waits for a holder. Its
operator may instead accept the loss: stop the server and start it again on the same
--save-state-dir with --accept-model-loss; the run goes on from its stored checkpoint
(docs/coordinator.md, "A lost model"). Refused, with the reason, when there is no saved
state or nothing would be lost.

A client's report of a Hub checkpoint is applied only once its commit is found on the main
branch of the run's repository (asked of the Hub at HF_ENDPOINT, by default the public
Hub); a commit only on a pull request's refs/pr/N, an unknown one, or a Hub that does not
answer is refused with the reason. A run without network turns this off with
--no-checkpoint-history-check (docs/coordinator.md, "Checkpoint reports").
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from coordinator.capabilities import explanations, unsupported_fields
from coordinator.config import ConfigError, load_data_config, load_state_file
from psyche_common.cli_conventions import PROGRAM_SETTINGS, psyche_tui_spelling, version_option
from psyche_common.telemetry.options import TelemetryOptions, telemetry_options

app = typer.Typer(**PROGRAM_SETTINGS, help="Psyche coordinator (TCP backend).",
                  no_args_is_help=True, add_completion=False)


@app.command("validate-config")
def validate_config(
    state: Annotated[Path, typer.Option("--state", help="the run's state.toml")],
    data_config: Annotated[Path | None, typer.Option(
        "--data-config", help="data.toml of the TCP data server")] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", help="a data dir missing on this machine is an error, not a warning")] = False,
) -> None:
    """Check a run configuration; print OK or every error."""
    errors: list[str] = []
    notes: list[str] = []
    warnings: list[str] = []
    try:
        state_file = load_state_file(state)
    except ConfigError as exc:
        errors += exc.errors
    else:  # valid: can this implementation's client run it? (coordinator/capabilities.py)
        errors += [f"{state}: {line}" for line in unsupported_fields(state_file)]
        notes = explanations(state_file)
    if data_config is not None:
        from coordinator_tcp.data_server import data_problems

        try:
            data = load_data_config(data_config)
        except ConfigError as exc:
            errors += exc.errors
        else:
            if not Path(data.dir).exists() and not strict:
                # As Psyche accepts it: the coordinator that serves the data may run on
                # another machine than the one validating (five of Psyche's configs).
                warnings.append(f"warning: {data_config}: dir {data.dir} does not exist on "
                                "this machine (fine if the data server runs elsewhere; "
                                "--strict makes it an error)")
            else:
                errors += data_problems(data, str(data_config))
    for line in warnings:
        typer.echo(line, err=True)
    if errors:
        for line in errors:
            typer.echo(line, err=True)
        raise typer.Exit(code=1)
    typer.echo("OK")
    for line in notes:
        typer.echo(line)


def _parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise typer.BadParameter(f"expected true or false, got {value!r}")


@app.command("run")
@telemetry_options
def run(
    state: Annotated[Path, typer.Option("--state", help="the run's state.toml")],
    server_port: Annotated[int, typer.Option("--server-port", min=0, max=65535,
                                             help="TCP port of the coordinator")] = 20000,
    data_config: Annotated[Path | None, typer.Option(
        "--data-config", help="data.toml of the TCP data server")] = None,
    save_state_dir: Annotated[Path | None, typer.Option(
        "--save-state-dir", help="save every state change here; resume from it")] = None,
    withdraw_on_disconnect: Annotated[str, typer.Option(
        "--withdraw-on-disconnect", help="true|false: withdraw a client whose connection "
        "drops during a warm-up or a round (from the cooldown on, the listed clients stay: "
        "they hold the epoch's model)")] = "true",
    init_warmup_time: Annotated[int | None, typer.Option(
        "--init-warmup-time", min=0, help="warmup_time until the run first becomes active "
        "(seconds)")] = None,
    tui: Annotated[bool, typer.Option("--tui/--no-tui", help="the server TUI")] = False,
    tick_interval: Annotated[float, typer.Option(
        "--tick-interval", min=0.01, max=60.0, help="seconds between ticks")] = 0.5,
    bind_host: Annotated[str, typer.Option(
        "--bind-host", help="interface the servers listen on")] = "0.0.0.0",
    accept_model_loss: Annotated[bool, typer.Option(
        "--accept-model-loss", help="the saved run's newer model is lost (MODEL LOST): go "
        "on from its stored checkpoint instead of waiting for a client that holds it "
        "(needs --save-state-dir)")] = False,
    no_checkpoint_history_check: Annotated[bool, typer.Option(
        "--no-checkpoint-history-check", help="apply a Hub checkpoint report without "
        "checking that its commit is on the main branch of the run's repository (for a "
        "run without network; by default the Hub at HF_ENDPOINT is asked, and a commit "
        "not on main, or no answer, is refused)")] = False,
    events_dir: Annotated[Path | None, typer.Option(
        "--events-dir", help="write every state change, join, leave and refusal here as "
        "event files (docs/events.md; `psyche-testnet replay` shows them)")] = None,
    *,
    telemetry: TelemetryOptions,
) -> None:
    """Run the TCP coordinator server for a run.

    Stops on SIGINT, SIGTERM, SIGHUP (q, ctrl+c, ctrl+q in the TUI): says
    "stopping…", closes every connection, saves the state (--save-state-dir),
    exits 0. A config error or a port in use: exit 1 at once, with the reason.
    """
    import asyncio
    import logging

    from coordinator_tcp.runner import RunOptions, run_coordinator
    from coordinator_tcp.server import ServerOptions

    withdraw = _parse_bool(withdraw_on_disconnect)
    if events_dir is not None:
        from psyche_common.event_files import events_dir_problem

        if problem := events_dir_problem(events_dir):
            typer.echo(f"error: --events-dir {problem}", err=True)
            raise typer.Exit(code=2)
    if tui:  # records go to the TUI's log panel (its handler), not to the terminal
        logging.getLogger().setLevel(logging.INFO)
    else:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                            "%(message)s")
    options = RunOptions(
        state_path=state, data_config_path=data_config, tui=tui, telemetry=telemetry,
        accept_model_loss=accept_model_loss,
        server=ServerOptions(host=bind_host, port=server_port, save_state_dir=save_state_dir,
                             withdraw_on_disconnect=withdraw, init_warmup_time=init_warmup_time,
                             tick_interval_s=tick_interval,
                             checkpoint_history_check=not no_checkpoint_history_check,
                             events_dir=events_dir))
    code = asyncio.run(run_coordinator(options))
    if code:
        raise typer.Exit(code=code)


@app.callback()  # a group (validate-config stays a subcommand) that takes --version
def _root(
    version: Annotated[bool, version_option("psyche-coordinator")] = False,
) -> None:
    """Psyche coordinator (TCP backend)."""


def main() -> None:
    import sys

    app(args=psyche_tui_spelling(sys.argv[1:]))
