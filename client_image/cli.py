"""``psyche-client``: the client's command line (Typer).

Only ``show-identity`` lives here for now; ``train`` is added by the runtime.
Import-light on purpose: heavy modules (torch, iroh) load inside commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="psyche-client",
    help="Psyche client: train with a run, share results over iroh.",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


@app.callback()
def _root() -> None:
    """Psyche client."""


@app.command("show-identity")
def show_identity(
    identity_secret_key_path: Annotated[
        Path | None,
        typer.Option(
            "--identity-secret-key-path",
            envvar="IDENTITY_SECRET_KEY_PATH",
            help="File of 32 raw secret bytes (openssl rand 32 > secret.key). "
            "Else RAW_IDENTITY_SECRET_KEY (64 hex digits) is used.",
        ),
    ] = None,
) -> None:
    """Print this node's public key (its p2p node id), hex-encoded."""
    import os

    from client_image.p2p.identity import RAW_SECRET_KEY_ENV, Identity, IdentityError

    if identity_secret_key_path is None and not os.environ.get(RAW_SECRET_KEY_ENV, "").strip():
        typer.echo(
            f"error: no identity given: pass --identity-secret-key-path or set {RAW_SECRET_KEY_ENV}",
            err=True,
        )
        raise typer.Exit(code=2)
    try:
        identity = Identity.load(identity_secret_key_path)
    except IdentityError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(code=2) from None
    typer.echo(identity.node_id)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
