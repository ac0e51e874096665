"""`print-all-help --markdown`: every command's help as one markdown document, as
Psyche's run-manager prints it (clap-markdown) for its docs.

The document: a title, an overview listing every command (sub-commands of groups such as
`wallet` as `wallet new`), then per command a heading and its `--help` text verbatim in
a fenced block, so that what the document says is what the program says.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import typer


def commands(context: Any) -> Iterator[tuple[str, Any]]:
    """(the command's words after the program, its context), depth first, hidden ones
    (this one among them) left out."""
    group: Any = context.command
    if not hasattr(group, "list_commands"):  # a command, not a group
        return
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None or command.hidden:
            continue
        child = typer.Context(command, info_name=name, parent=context)
        words = " ".join(part for part in (child.command_path.split(" ")[1:]) if part)
        yield words, child
        yield from commands(child)


def markdown(root: Any) -> str:
    """The whole document for the program of `root`."""
    program = root.info_name or "run-manager"
    found = list(commands(root))
    lines = [f"# Command-line help for `{program}`", "",
             "This document contains the help content of every `run-manager` command "
             "(`run-manager print-all-help --markdown`).", "", "**Command Overview:**", ""]
    lines += [f"* [`{program}`](#{program})"]
    lines += [f"* [`{program} {words}`](#{anchor(program, words)})" for words, _ in found]
    lines += ["", f"## `{program}`", "", "```", root.command.get_help(root).rstrip(), "```"]
    for words, context in found:
        lines += ["", f"## `{program} {words}`", "", "```",
                  context.command.get_help(context).rstrip(), "```"]
    return "\n".join(lines) + "\n"


def anchor(program: str, words: str) -> str:
    return f"{program}-{words}".replace(" ", "-")


def register(app: typer.Typer) -> None:
    @app.command("print-all-help", hidden=True)
    def print_all_help(
        ctx: typer.Context,
        as_markdown: Annotated[bool, typer.Option(
            "--markdown", help="As one markdown document (required, as in Psyche).")] = False,
    ) -> None:
        """Print every command's help as one markdown document."""
        if not as_markdown:
            typer.echo("run-manager: print-all-help needs --markdown (its only format, as in "
                       "Psyche)", err=True)
            raise typer.Exit(2)
        typer.echo(markdown(ctx.find_root()), nl=False)
