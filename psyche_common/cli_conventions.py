"""What every program's command line shares: `-h` as `--help`, `--version`, help that fits
80 columns, and `--tui/--no-tui`.

    app = typer.Typer(**PROGRAM_SETTINGS, help=...)
    @app.callback()
    def root(version: Annotated[bool, version_option("psyche-coordinator")] = False): ...

Typer's Rich help draws each option as a table row and cuts long option names, env var
names and URLs with "…" at 80 columns; Click's own formatter wraps them instead, so every
program uses it (rich_markup_mode=None). Click also cuts each command's summary to one line
beside the longest command name; SummaryWrappingGroup shows the whole first sentence.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:  # Typer carries its own Click; these have no public names
    from typer._click.core import Context
    from typer._click.formatting import HelpFormatter

DISTRIBUTION = "psyche-py"
HELP_OPTION_NAMES = ["-h", "--help"]
PSYCHE_TUI_VALUES = {"true": "--tui", "1": "--tui", "yes": "--tui",
                     "false": "--no-tui", "0": "--no-tui", "no": "--no-tui"}


class SummaryWrappingGroup(TyperGroup):
    """A command group whose command list wraps each summary instead of cutting it."""

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# Keyword arguments of every program's typer.Typer(...) (and of its sub-apps).
PROGRAM_SETTINGS: dict[str, Any] = {
    "context_settings": {"help_option_names": HELP_OPTION_NAMES},
    "rich_markup_mode": None,
    "cls": SummaryWrappingGroup,
}


def package_version() -> str:
    """The installed psyche-py's version (the one pyproject.toml names)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def version_option(program: str) -> Any:
    """A `--version` option printing "<program> <version>" and exiting 0, before any
    other option is checked (a required one included)."""

    def print_version(requested: bool) -> None:
        if requested:
            typer.echo(f"{program} {package_version()}")
            raise typer.Exit()

    return typer.Option("--version", callback=print_version, is_eager=True,
                        help="Print the program's version and exit.")


def psyche_tui_spelling(args: list[str]) -> list[str]:
    """`--tui true|false` (Psyche's spelling, a value) read as `--tui` / `--no-tui`.

    Click flags take no value, so the old spelling is rewritten before parsing; any other
    value after `--tui` is left for Click to refuse.
    """
    rewritten: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":  # the rest belongs to someone else (a container, a subprocess)
            rewritten += args[index:]
            break
        if arg.startswith("--tui="):
            value = arg.removeprefix("--tui=").strip().lower()
            rewritten.append(PSYCHE_TUI_VALUES.get(value, arg))
        elif (arg == "--tui" and index + 1 < len(args)
              and args[index + 1].strip().lower() in PSYCHE_TUI_VALUES):
            index += 1
            rewritten.append(PSYCHE_TUI_VALUES[args[index].strip().lower()])
        else:
            rewritten.append(arg)
        index += 1
    return rewritten
