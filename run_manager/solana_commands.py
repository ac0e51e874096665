"""The subcommands that need Psyche's on-chain programs (the Solana backend).

They are laid out now, with Psyche's names and help, so the command tree reads as the
finished tool will; each says plainly that it needs the Solana backend and exits 2.
The Solana issue replaces `_not_yet` with the real implementation, command by command.
"""

from __future__ import annotations

from collections.abc import Callable

import typer

SOLANA_PANEL = "Solana runs (need the Solana backend)"

# name -> what it will do (Psyche's run-manager subcommands, reference section 10).
SOLANA_COMMANDS: dict[str, str] = {
    "can-join": "Check whether an address may join a run (authorization and run state).",
    "list-runs": "List the runs of the coordinator program.",
    "create-run": "Create a run: coordinator account, optional treasurer and join authority.",
    "close-run": "Close a run and reclaim its accounts' rent.",
    "update-config": "Update a run's config, model, client version or metadata.",
    "set-paused": "Pause a run, or resume it with --resume.",
    "set-future-epoch-rates": "Set a treasurer run's earning and slashing rates for future epochs.",
    "checkpoint": "Record a Hub checkpoint for a run.",
    "tick": "Tick a run's coordinator periodically.",
    "json-dump-run": "Print a run's on-chain state as JSON.",
    "json-dump-user": "Print one user's on-chain state in a run as JSON.",
    "join-authorization-create": "Create a join authorization for a grantee.",
    "join-authorization-read": "Show a join authorization.",
    "join-authorization-delegate": "Add or clear the delegates of a join authorization.",
    "join-authorization-delete": "Delete a join authorization.",
    "treasurer-claim-rewards": "Claim the rewards earned in a treasurer run.",
    "treasurer-top-up-rewards": "Add collateral to a treasurer run's reward vault.",
}

EXIT_NEEDS_SOLANA = 2


def _not_yet(name: str) -> Callable[[typer.Context], None]:
    def command(ctx: typer.Context) -> None:
        typer.echo(
            f"run-manager {name}: needs the Solana backend (the on-chain coordinator, "
            "authorizer and treasurer programs), which this version does not have yet. "
            "TCP runs need no such command.",
            err=True,
        )
        raise typer.Exit(EXIT_NEEDS_SOLANA)

    command.__name__ = name.replace("-", "_")
    return command


def register(app: typer.Typer) -> None:
    # Unknown options are accepted so `create-run -r x -c 1` reaches the clear message
    # rather than a parser error about an option the real command will have.
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    for name, summary in SOLANA_COMMANDS.items():
        app.command(name, help=summary, rich_help_panel=SOLANA_PANEL, context_settings=settings)(
            _not_yet(name)
        )
