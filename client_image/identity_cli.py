"""``psyche-client``'s identity commands, under Psyche's names and in its format.

Psyche's centralized client has ``show-identity [--identity-secret-key-path P]``; its
Solana client has ``show-static-p2p-identity [P]`` and ``create-static-p2p-identity
SAVE_PATH`` (architectures/{centralized/client,decentralized/solana-client}/src/main.rs).
All three print ``print_identity_keys`` (shared/client/src/cli.rs)::

    Public key: <64 hex digits>
    Secret key: <64 hex digits>

and ``create`` adds ``Wrote secret key to SAVE_PATH``. The key comes from the file, else
from RAW_IDENTITY_SECRET_KEY (psyche_common.identity). Ours differ on purpose in two
places: ``create-static-p2p-identity`` never overwrites a file (Psyche does: a lost
identity cannot be recovered) and writes it mode 600, and ``--public-key-only`` prints
the bare hex node id, without the secret, for scripts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from psyche_common.identity import Identity

PublicKeyOnly = Annotated[bool, typer.Option(
    "--public-key-only", help="Print only the public key (hex), without the secret.")]


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=code)


def _print(identity: Identity, public_key_only: bool) -> None:
    if public_key_only:
        typer.echo(identity.node_id)
        return
    typer.echo(f"Public key: {identity.node_id}")
    typer.echo(f"Secret key: {identity.secret_key.hex()}")


def _load(path: Path | None, how: str) -> Identity:
    """The file's key, else RAW_IDENTITY_SECRET_KEY's; never a fresh one (that shows nothing)."""
    from psyche_common.identity import RAW_SECRET_KEY_ENV, Identity, IdentityError

    if path is None and not os.environ.get(RAW_SECRET_KEY_ENV, "").strip():
        raise _fail(f"no identity given: {how} or set {RAW_SECRET_KEY_ENV}")
    try:
        return Identity.load(path)
    except IdentityError as error:
        raise _fail(str(error)) from None


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
    public_key_only: PublicKeyOnly = False,
) -> None:
    """Print this node's public key (its p2p node id) and secret key, hex-encoded."""
    _print(_load(identity_secret_key_path, "pass --identity-secret-key-path"), public_key_only)


def show_static_p2p_identity(
    identity_secret_key_path: Annotated[
        Path | None,
        typer.Argument(help="File of 32 raw secret bytes; else RAW_IDENTITY_SECRET_KEY is used."),
    ] = None,
    public_key_only: PublicKeyOnly = False,
) -> None:
    """Psyche's Solana-client name for show-identity: print the p2p identity's keys."""
    _print(_load(identity_secret_key_path, "give the key file"), public_key_only)


def create_static_p2p_identity(
    save_path: Annotated[Path, typer.Argument(help="Where to write the 32 secret bytes (mode 600).")],
) -> None:
    """Create a p2p identity: 32 random secret bytes in SAVE_PATH; print its keys."""
    from psyche_common.identity import Identity

    identity = Identity.generate()
    try:
        # O_EXCL: never overwrite an identity, even one created between a check and the write.
        descriptor = os.open(save_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise _fail(f"{save_path} exists; refusing to overwrite an identity", 1) from None
    except OSError as error:
        raise _fail(f"cannot create {save_path}: {error.strerror}", 1) from None
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(identity.secret_key)
    _print(identity, public_key_only=False)
    typer.echo(f"Wrote secret key to {save_path}")


def register(app: typer.Typer) -> None:
    app.command("show-identity")(show_identity)
    app.command("show-static-p2p-identity")(show_static_p2p_identity)
    app.command("create-static-p2p-identity")(create_static_p2p_identity)
