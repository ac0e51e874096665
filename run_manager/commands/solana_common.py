"""Shared by the Solana subcommands (`run_manager.commands.solana`): the common options,
wallet and public-key parsing, and `run_rpc`, which runs one piece of JSON-RPC work and
turns every failure into a message and an exit code.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

SOLANA_PANEL = "Solana runs"
EXIT_FAILED = 1
EXIT_BAD_ARGUMENT = 2
T = TypeVar("T")

PROGRAM_ID_VARIABLE = "PSYCHE_COORDINATOR_PROGRAM_ID"
LOCALNET_URL = "http://127.0.0.1:8899"  # psyche-localnet's default address
Rpc = Annotated[str, typer.Option("--rpc", envvar="RPC", help="Solana JSON-RPC URL.")]
Rpc2 = Annotated[str | None, typer.Option("--rpc-2", envvar="RPC_2", help="Fallback RPC URL.")]
ProgramId = Annotated[str | None, typer.Option(
    "--coordinator-program-id", envvar="PSYCHE_COORDINATOR_PROGRAM_ID",
    help="The coordinator program (default: ours).")]
RunId = Annotated[str, typer.Option("--run-id", "-r", envvar="RUN_ID", help="The run id.")]
Wallet = Annotated[Path | None, typer.Option(
    "--wallet-private-key-path", "-w", "--wallet", envvar=["WALLET_PRIVATE_KEY_PATH", "WALLET_PATH"],
    help="Keypair file (or set RAW_WALLET_PRIVATE_KEY, which wins, as in Psyche).")]


def _websocket_url(flag: str) -> Callable[[str | None], str | None]:
    def check(value: str | None) -> str | None:
        if value is not None and not value.startswith(("ws://", "wss://")):
            raise fail(f"{flag} must be a ws:// or wss:// URL, got {value!r}", EXIT_BAD_ARGUMENT)
        return value
    return check


# Psyche's subcommands take --ws-rpc (env WS_RPC) beside --rpc; ours send transactions and
# read accounts over --rpc alone, so the WebSocket URL is only checked, for Psyche's
# scripts (and env files, which set both) to run unchanged.
_UNUSED_WS = "Accepted as Psyche's and checked; unused: this command needs --rpc only."
WsRpc = Annotated[str | None, typer.Option(
    "--ws-rpc", envvar="WS_RPC", callback=_websocket_url("--ws-rpc"), help=_UNUSED_WS)]
WsRpc2 = Annotated[str | None, typer.Option(
    "--ws-rpc-2", envvar="WS_RPC_2", callback=_websocket_url("--ws-rpc-2"),
    help="Fallback of --ws-rpc; unused too.")]


def with_websocket_options(command: Callable[..., None]) -> Callable[..., None]:
    """`command` with Psyche's --ws-rpc and --ws-rpc-2 added to its options (checked by
    Typer, then dropped before the call), so that no subcommand repeats them."""
    signature = inspect.signature(command, eval_str=True)
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
             for name, kind in (("ws_rpc", WsRpc), ("ws_rpc_2", WsRpc2))]

    @functools.wraps(command)
    def wrapper(*args: Any, ws_rpc: str | None = None, ws_rpc_2: str | None = None,
                **kwargs: Any) -> None:
        command(*args, **kwargs)

    parameters = [*signature.parameters.values(), *extra]
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]  # Typer reads the signature
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    return wrapper


# Psyche's can-join and json-dump-user: `--address PUBKEY`, aliases `--wallet` and `--user`.
Address = Annotated[str, typer.Option(
    "--address", "--wallet", "--user", metavar="PUBKEY",
    help="The user's public key (or a keypair file: its public key); --wallet and --user "
         "are Psyche's aliases.")]


def parse_address(text: str) -> Any:
    """--address/--wallet/--user: a base-58 public key, as in Psyche, or a keypair file
    (this CLI's other --wallet is one), read for its public key only."""
    from solders.keypair import Keypair
    from solders.pubkey import Pubkey

    from psyche_common.wallet import WalletError, load_keypair_bytes

    try:
        return Pubkey.from_string(text)
    except ValueError:
        pass
    if Path(text).is_file():
        try:
            return Keypair.from_bytes(load_keypair_bytes(Path(text))).pubkey()
        except WalletError as error:
            raise fail(f"--address {text}: {error}", EXIT_BAD_ARGUMENT) from None
    raise fail(f"--address is neither a base-58 public key nor a keypair file: {text!r}",
               EXIT_BAD_ARGUMENT)


TreasurerIndex = Annotated[int | None, typer.Option(
    "--treasurer-index", help="Treasurer run index (default: from the run id).")]


def fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    typer.echo(f"run-manager: {message}", err=True)
    return typer.Exit(code)


def signing_keypair(path: Path | None) -> Any:
    """The signing wallet. RAW_WALLET_PRIVATE_KEY (a JSON byte array or base58) wins over
    the keypair file, as in Psyche's run-manager; when both are set, a warning says so."""
    from solders.keypair import Keypair

    from psyche_common.wallet import WalletError, load_keypair_bytes, parse_keypair_text

    raw = os.environ.get("RAW_WALLET_PRIVATE_KEY", "").strip()
    try:
        if raw:
            if path is not None:
                typer.echo("run-manager: warning: RAW_WALLET_PRIVATE_KEY and "
                           f"--wallet-private-key-path {path} are both set: signing with "
                           "RAW_WALLET_PRIVATE_KEY, as Psyche does", err=True)
            return Keypair.from_bytes(parse_keypair_text(raw, "RAW_WALLET_PRIVATE_KEY"))
        if path is not None:
            return Keypair.from_bytes(load_keypair_bytes(path))
    except WalletError as error:
        raise fail(f"wallet: {error}", EXIT_BAD_ARGUMENT) from None
    raise fail("a wallet is needed: -w/--wallet-private-key-path or RAW_WALLET_PRIVATE_KEY",
                EXIT_BAD_ARGUMENT)


def parse_pubkey(text: str, what: str) -> Any:
    from solders.pubkey import Pubkey

    try:
        return Pubkey.from_string(text)
    except ValueError:
        raise fail(f"{what} is not a base-58 public key: {text!r}", EXIT_BAD_ARGUMENT) from None


def parse_amount(text: str, decimals: int, what: str) -> int:
    """`text` in units with `decimals` decimal places (Psyche's UI amounts, e.g. 1.5 of a
    6-decimal token) as the integer base units stored on chain; a bad value is a one-line
    error (exit 2)."""
    from decimal import Decimal, InvalidOperation

    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise fail(f"{what}: not a number: {text!r}", EXIT_BAD_ARGUMENT) from None
    if not value.is_finite() or value < 0:
        raise fail(f"{what}: must be a finite number >= 0, got {text!r}", EXIT_BAD_ARGUMENT)
    scaled = value.scaleb(decimals)
    if scaled != scaled.to_integral_value():
        unit = f"{decimals} decimal places" if decimals else "whole numbers"
        raise fail(f"{what}: {text} has more precision than the amount allows ({unit})",
                    EXIT_BAD_ARGUMENT)
    if scaled > 2**64 - 1:
        raise fail(f"{what}: {text} is too large (at most {Decimal(2**64 - 1).scaleb(-decimals)})",
                    EXIT_BAD_ARGUMENT)
    return int(scaled)


def run_rpc(rpc: str, rpc_2: str | None, program_id: str | None,
         work: Callable[[Any], Awaitable[T]], rpc_3: str | None = None) -> T:
    """Run `work(SolanaRpc)` against `program_id` (None: ours), turning every failure
    into a clear message. RPC_2, then RPC_3, are the fallback endpoints."""
    from psyche_solana.accounts import AccountDecodeError
    from psyche_solana.ids import program_id as cached_program_id
    from psyche_solana.rpc import RpcError, SolanaRpc
    from psyche_solana.runs import RunNotFound

    if program_id is not None:
        parse_pubkey(program_id, "--coordinator-program-id")

    async def main() -> T:
        async with SolanaRpc([rpc, rpc_2, rpc_3]) as client:
            return await work(client)

    # psyche_solana.ids reads the override from the environment and caches it; put both
    # back afterwards so that one command never changes the program of the next (tests)
    before = os.environ.get(PROGRAM_ID_VARIABLE)
    if program_id is not None:
        os.environ[PROGRAM_ID_VARIABLE] = program_id
    cached_program_id.cache_clear()
    try:
        return asyncio.run(main())
    except (RpcError, RunNotFound, AccountDecodeError, ValueError) as error:
        raise fail(str(error)) from None
    finally:
        if before is None:
            os.environ.pop(PROGRAM_ID_VARIABLE, None)
        else:
            os.environ[PROGRAM_ID_VARIABLE] = before
        cached_program_id.cache_clear()
