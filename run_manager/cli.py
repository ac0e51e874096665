"""`run-manager`: run and supervise a client, manage wallets; Solana commands laid out.

Textual is imported only when the TUI starts: `--help`, `--no-tui` and every other
subcommand stay fast and work on machines without a terminal.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from psyche_common.telemetry.options import TelemetryOptions, telemetry_options
from run_manager.commands import solana

if TYPE_CHECKING:
    from collections.abc import Callable

    from run_manager.docker_supervisor import SupervisorEvent
    from run_manager.monitor import Part
    from run_manager.telemetry import RunManagerTelemetry

EXIT_CONFIG_ERROR = 2
EXIT_RUN_FAILED = 1

app = typer.Typer(
    name="run-manager",
    help="Run a psyche-py client in its versioned container and watch it train.",
    rich_markup_mode="rich",
    add_completion=False,
)
wallet_app = typer.Typer(help="Wallets (solana-keygen keypair files): new, show, balance.")
app.add_typer(wallet_app, name="wallet")
solana.register(app)

WalletOption = Annotated[
    Path,
    typer.Option("--wallet", envvar=["WALLET_PRIVATE_KEY_PATH", "WALLET_PATH"], help="Keypair file."),
]


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"run-manager: {message}", err=True)
    return typer.Exit(code)


@app.callback(invoke_without_command=True)
@telemetry_options
def run(
    ctx: typer.Context,
    env_file: Annotated[
        Path | None, typer.Option("--env-file", help="KEY=VALUE settings of the run.")
    ] = None,
    no_tui: Annotated[bool, typer.Option("--no-tui", help="Log lines instead of the TUI.")] = False,
    client_version: Annotated[
        str | None,
        typer.Option("--client-version", help="Run this client version instead of asking the coordinator."),
    ] = None,
    entrypoint: Annotated[
        str | None,
        typer.Option("--entrypoint", help="Override the image's entry point; its arguments follow `--`."),
    ] = None,
    *,
    telemetry: TelemetryOptions,
) -> None:
    """Start the client the run wants, keep it alive, and show the run.

    [b]run-manager --env-file run.env[/b]   (arguments after [b]--[/b] go to the container)
    """
    if ctx.invoked_subcommand is not None:
        return
    if env_file is None:
        raise _fail("--env-file is required to run a client (see run-manager --help)", EXIT_CONFIG_ERROR)
    from run_manager.runner import RunOptions

    container_args = list((ctx.obj or {}).get("container_args", []))
    options = RunOptions(client_version, entrypoint, container_args)
    raise typer.Exit(_run_client(env_file, options, tui=not no_tui, telemetry=telemetry))


def _run_client(env_file: Path, options: object, tui: bool,
                telemetry: TelemetryOptions | None = None) -> int:
    from psyche_common.metrics_source import HttpClientMetricsSource
    from psyche_common.wallet import public_key
    from run_manager import engine
    from run_manager.docker_supervisor import Supervisor, SupervisorFinished
    from run_manager.monitor import Monitor
    from run_manager.runner import (
        RunOptions,
        SourceUnavailable,
        make_coordinator_source,
        run_headless,
        supervisor_config,
    )
    from run_manager.settings import (
        SettingsError,
        load_settings,
        read_env_file,
        unread_variables,
    )
    from run_manager.view import Dashboard

    assert isinstance(options, RunOptions)
    try:
        settings = load_settings(env_file)
        options.env_file_variables = read_env_file(env_file)
        for name in unread_variables(options.env_file_variables):
            typer.echo(f"run-manager: warning: {env_file}: {name} is read by neither the "
                       "run-manager nor the client (a typo?)", err=True)
        coordinator = make_coordinator_source(settings, options.pinned_version)
    except SettingsError as error:
        for problem in error.problems:
            typer.echo(f"run-manager: {problem}", err=True)
        return EXIT_CONFIG_ERROR
    except (SourceUnavailable, ValueError) as error:
        typer.echo(f"run-manager: {error}", err=True)
        return EXIT_CONFIG_ERROR
    try:
        client = engine.connect()
    except engine.EngineError as error:
        typer.echo(f"run-manager: {error}", err=True)
        return EXIT_RUN_FAILED
    dashboard = Dashboard()
    if settings.WALLET_PRIVATE_KEY_PATH is not None:
        dashboard.wallet.address = public_key(settings.WALLET_PRIVATE_KEY_PATH)
    config = supervisor_config(settings, options)
    metrics = HttpClientMetricsSource(settings.METRICS_LOCAL_PORT)

    try:
        exporter = _start_telemetry(telemetry, settings.RUN_ID, dashboard.wallet.address)
    except OSError as error:
        typer.echo(f"run-manager: --prometheus-port: {error}", err=True)
        return EXIT_CONFIG_ERROR

    def make_supervisor(on_event: Callable[[SupervisorEvent], None]) -> Supervisor:
        if exporter is not None:
            on_event = exporter.wrap(on_event)  # counts starts, exits and restarts
        return Supervisor(client, coordinator, config, on_event)

    def make_monitor(on_change: Callable[[Part], None]) -> Monitor:
        return Monitor(dashboard, coordinator, metrics, on_change, rpc_url=settings.RPC)

    if tui:
        from run_manager.tui.app import RunManagerApp

        tui_app = RunManagerApp(dashboard, make_supervisor, make_monitor)
        tui_app.run()
        finished = tui_app.finished
        asyncio.run(_close(coordinator, metrics))
    else:

        async def headless() -> SupervisorFinished:
            # The sources' connections live on this loop: close them on it too.
            try:
                return await run_headless(make_supervisor, make_monitor, dashboard)
            finally:
                await _close(coordinator, metrics)

        finished = asyncio.run(headless())
    if exporter is not None:
        exporter.telemetry.shutdown()
    if finished is not None and finished.reason in ("gave-up", "error"):
        typer.echo(f"run-manager: {finished.message}", err=True)
        return EXIT_RUN_FAILED
    return 0


def _start_telemetry(options: TelemetryOptions | None, run_id: str,
                     wallet: str | None) -> RunManagerTelemetry | None:
    if options is None or not options.exports_anything:
        return None
    import socket

    from psyche_common.telemetry import ServiceIdentity, Telemetry
    from run_manager.telemetry import RunManagerTelemetry

    identity = ServiceIdentity("run-manager", wallet or socket.gethostname(), run_id)
    return RunManagerTelemetry(Telemetry.start(options, identity))


async def _close(*sources: object) -> None:
    for source in sources:
        close = getattr(source, "close", None)
        if close is not None:
            await close()


@wallet_app.command("new")
def wallet_new(
    path: Annotated[Path, typer.Argument(help="Where to write the keypair (mode 600).")],
) -> None:
    """Create a solana-keygen-compatible keypair file; never overwrites one."""
    from psyche_common.wallet import WalletError, create_keypair_file

    try:
        pubkey = create_keypair_file(path)
    except WalletError as error:
        raise _fail(str(error), EXIT_RUN_FAILED) from None
    typer.echo(f"Wrote new keypair to {path}")
    typer.echo(f"pubkey: {pubkey}")


@wallet_app.command("show")
def wallet_show(wallet: WalletOption) -> None:
    """Print the wallet's public key (base58)."""
    from psyche_common.wallet import WalletError, public_key

    try:
        typer.echo(public_key(wallet))
    except WalletError as error:
        raise _fail(str(error), EXIT_RUN_FAILED) from None


@wallet_app.command("balance")
def wallet_balance(
    rpc: Annotated[str, typer.Option("--rpc", envvar="RPC", help="Solana JSON-RPC URL.")],
    wallet: Annotated[
        Path | None,
        typer.Option("--wallet", envvar=["WALLET_PRIVATE_KEY_PATH", "WALLET_PATH"], help="Keypair file."),
    ] = None,
    address: Annotated[str | None, typer.Option("--address", help="Any public key.")] = None,
) -> None:
    """Print the SOL balance of the wallet (or --address), asked over RPC."""
    from psyche_common.wallet import WalletError, format_sol, get_balance, public_key

    if (wallet is None) == (address is None):
        raise _fail("give exactly one of --wallet and --address", EXIT_CONFIG_ERROR)
    try:
        if address is not None:
            target = address
        else:
            assert wallet is not None  # exactly one of --wallet and --address, checked above
            target = public_key(wallet)
        lamports = get_balance(rpc, target)
    except WalletError as error:
        raise _fail(str(error), EXIT_RUN_FAILED) from None
    typer.echo(f"{target}: {format_sol(lamports)} ({lamports} lamports)")


def split_container_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after the first `--` belongs to the container, as in Psyche."""
    if "--" not in argv:
        return argv, []
    index = argv.index("--")
    return argv[:index], argv[index + 1 :]


def main(argv: list[str] | None = None) -> None:
    own, container_args = split_container_args(sys.argv[1:] if argv is None else argv)
    app(args=own, obj={"container_args": container_args}, prog_name="run-manager")


if __name__ == "__main__":
    main()
