"""`psyche-testnet replay`: a run shown again from the event files its coordinator and
clients wrote with `--events-dir` (docs/events.md).

    psyche-testnet replay --events-dir events [--speed 4] [--follow] [--no-tui]

The TUI (local_testnet/replay_tui.py) plays the run from its first record at `--speed`
times the pace it happened (0: at once); `--follow` keeps reading the files as they grow
(a live run). `--no-tui` prints the run as the files tell it, one JSON line (the final
state and step, each client's steps trained and last loss, the lines that are not
records), with each bad or torn line on stderr. A directory that is not one: one line,
exit 2; no event files in it (without --follow): exit 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from local_testnet.replay import RunReplay
from psyche_common.cli_conventions import PROGRAM_SETTINGS
from psyche_common.event_files import event_files, read_events

app = typer.Typer(**PROGRAM_SETTINGS, add_completion=False)


@app.command()
def replay(
    events_dir: Annotated[Path, typer.Option(
        "--events-dir", help="the --events-dir of the run's coordinator and clients")],
    speed: Annotated[float, typer.Option(
        "--speed", min=0.0, help="times the pace the run happened (0: at once)")] = 1.0,
    follow: Annotated[bool, typer.Option(
        "--follow", help="keep reading the files as they grow (a live run)")] = False,
    tui: Annotated[bool, typer.Option("--tui/--no-tui", help="the replay TUI, or one "
                                      "JSON line of the run as the files tell it")] = True,
) -> None:
    """Show a run again from its event files: finished from the start, or live."""
    if not events_dir.is_dir():
        typer.echo(f"error: --events-dir {events_dir} is not a directory", err=True)
        raise typer.Exit(code=2)
    try:
        files = event_files(events_dir)
    except OSError as exc:
        typer.echo(f"error: --events-dir {events_dir}: {exc.strerror or exc}", err=True)
        raise typer.Exit(code=2) from None
    if not files and not follow:
        typer.echo(f"error: no event files in {events_dir} (written by --events-dir of "
                   "psyche-coordinator run and psyche-client train)", err=True)
        raise typer.Exit(code=1)
    if tui:
        from local_testnet.replay_tui import ReplayApp

        ReplayApp(events_dir, speed=speed, follow=follow).run()
        return
    result = read_events(events_dir)
    run = RunReplay()
    for record in result.records:
        run.apply(record)
    run.add_bad(result.bad)
    for line in result.bad:
        typer.echo(line.describe(), err=True)
    print(json.dumps(run.summary()), flush=True)


def main(args: list[str]) -> None:
    app(args=args, prog_name="psyche-testnet replay")
