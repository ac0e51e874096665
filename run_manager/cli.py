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

from psyche_common.cli_conventions import PROGRAM_SETTINGS, version_option
from psyche_common.telemetry.options import TelemetryOptions, telemetry_options
from run_manager.commands import airdrop, help_markdown, mining_pool, solana

if TYPE_CHECKING:
    from collections.abc import Callable

    from run_manager.docker_supervisor import SupervisorEvent
    from run_manager.monitor import Part
    from run_manager.settings import RunManagerSettings
    from run_manager.telemetry import RunManagerTelemetry

EXIT_CONFIG_ERROR = 2
EXIT_RUN_FAILED = 1

app = typer.Typer(
    **PROGRAM_SETTINGS,
    name="run-manager",
    help="Run a psyche-py client in its versioned container and watch it train.",
    add_completion=False,
)
wallet_app = typer.Typer(**PROGRAM_SETTINGS,
                         help="Wallets (solana-keygen keypair files): new, show, balance, "
                              "airdrop.")
app.add_typer(wallet_app, name="wallet")
solana.register(app)
airdrop.register(app)
mining_pool.register(app)
help_markdown.register(app)  # last: it lists the commands registered

WalletOption = Annotated[
    Path,
    typer.Option("--wallet", "-w", "--wallet-private-key-path",
                 envvar=["WALLET_PRIVATE_KEY_PATH", "WALLET_PATH"],
                 help="Keypair file."),
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
    tui: Annotated[bool, typer.Option("--tui/--no-tui",
                                      help="The TUI, or log lines instead (its panels and alarms, e.g. COORDINATOR SILENT).")] = True,
    client_version: Annotated[
        str | None,
        typer.Option("--client-version", help="Run this client version instead of asking the coordinator."),
    ] = None,
    entrypoint: Annotated[
        str | None,
        typer.Option("--entrypoint", help="Override the image's entry point; its arguments follow `--`."),
    ] = None,
    local: Annotated[
        bool, typer.Option("--local", help="Run the client image on this machine; never pull it.")
    ] = False,
    authorizer: Annotated[
        str | None,
        typer.Option("--authorizer", help="Without RUN_ID: only join runs whose join authority is this key."),
    ] = None,
    coordinator_program_id: Annotated[
        str | None,
        typer.Option("--coordinator-program-id",
                     help="The coordinator program (default: ours; env PSYCHE_COORDINATOR_PROGRAM_ID)."),
    ] = None,
    metrics_local_port: Annotated[
        int | None,
        typer.Option("--metrics-local-port", min=1, max=65535,
                     help="The client's metrics port (else METRICS_LOCAL_PORT; else 6269, or a "
                          "free port when 6269 is taken)."),
    ] = None,
    version: Annotated[bool, version_option("run-manager")] = False,
    *,
    telemetry: TelemetryOptions,
) -> None:
    """Start the client the run wants, keep it alive, and show the run.

    run-manager --env-file run.env   (arguments after -- go to the container)
    """
    if ctx.invoked_subcommand is not None:
        return
    if env_file is None:
        raise _fail("--env-file is required to run a client (see run-manager --help)", EXIT_CONFIG_ERROR)
    from run_manager.runner import RunOptions

    for flag, key in (("--authorizer", authorizer), ("--coordinator-program-id", coordinator_program_id)):
        if key is not None and not _is_pubkey(key):
            raise _fail(f"{flag}: not a base58 public key: {key!r}", EXIT_CONFIG_ERROR)
    if coordinator_program_id is not None:
        _use_coordinator_program(coordinator_program_id)
    container_args = list((ctx.obj or {}).get("container_args", []))
    options = RunOptions(client_version, entrypoint, container_args, local=local,
                         coordinator_program_id=coordinator_program_id, join_authority=authorizer)
    raise typer.Exit(_run_client(env_file, options, tui=tui, telemetry=telemetry,
                                 metrics_local_port=metrics_local_port))


def _is_pubkey(text: str) -> bool:
    from solders.pubkey import Pubkey

    try:
        Pubkey.from_string(text)
    except ValueError:
        return False
    return True


def _use_coordinator_program(program_id: str) -> None:
    """Psyche's --coordinator-program-id: psyche_solana.ids reads the override from the
    environment (and caches it), here and in the client, which gets it too."""
    import os

    from psyche_solana.ids import program_id as cached_program_id

    os.environ["PSYCHE_COORDINATOR_PROGRAM_ID"] = program_id
    cached_program_id.cache_clear()


def _run_client(env_file: Path, options: object, tui: bool,
                telemetry: TelemetryOptions | None = None,
                metrics_local_port: int | None = None) -> int:
    from psyche_common.metrics_source import HttpClientMetricsSource
    from psyche_common.stopping import exit_on_signals
    from psyche_common.wallet import keypair_public_key
    from run_manager import engine
    from run_manager.discovery import DiscoveryFailed
    from run_manager.docker_supervisor import Supervisor, SupervisorFinished
    from run_manager.gpus import describe_gpus
    from run_manager.host_conflicts import ManagedElsewhere, choose_metrics_port, clear_host_for_run
    from run_manager.monitor import Monitor
    from run_manager.runner import (
        RunOptions,
        SourceUnavailable,
        make_coordinator_source,
        make_join_check,
        run_headless,
        supervisor_config,
    )
    from run_manager.settings import (
        SettingsError,
        env_file_warnings,
        load_settings,
        read_env_file,
    )
    from run_manager.view import Dashboard

    assert isinstance(options, RunOptions)
    # Until the supervisor runs (no container yet), a signal ends the run-manager at once;
    # from then on run_headless, or the TUI (run_tui), stops the container first.
    exit_on_signals(0, lambda sig: f"stopping… ({sig.name})")
    try:
        settings = load_settings(env_file)
        options.env_file_variables = read_env_file(env_file)
        for warning in env_file_warnings(options.env_file_variables, settings):
            typer.echo(f"run-manager: warning: {env_file}: {warning}", err=True)
        settings = settings_with_chosen_run(settings, options.join_authority)
        client = engine.connect()
        # This run's leftover client (of a run-manager killed with SIGKILL) holds the
        # metrics port: it goes before the port is checked.
        for removed in clear_host_for_run(client, settings.run_id):
            typer.echo(f"run-manager: {removed}", err=True)
        # The container shares the host's network: a second run here needs another port.
        if metrics_local_port is None and "METRICS_LOCAL_PORT" in settings.model_fields_set:
            metrics_local_port = settings.METRICS_LOCAL_PORT
        metrics_port = choose_metrics_port(metrics_local_port)  # PortTaken: a ValueError
        settings = settings.model_copy(update={"METRICS_LOCAL_PORT": metrics_port.port})
        if metrics_port.moved is not None:
            typer.echo(f"run-manager: {metrics_port.moved}", err=True)
        coordinator = make_coordinator_source(settings, options.pinned_version)
        join_check = make_join_check(settings, coordinator, options.pinned_version)
        config = supervisor_config(settings, options)  # GpuSelectionError: a "GPUS: ..." line
    except SettingsError as error:
        for problem in error.problems:
            typer.echo(f"run-manager: {problem}", err=True)
        return EXIT_CONFIG_ERROR
    except (SourceUnavailable, ValueError) as error:
        typer.echo(f"run-manager: {error}", err=True)
        return EXIT_CONFIG_ERROR
    except (DiscoveryFailed, engine.EngineError, ManagedElsewhere) as error:
        typer.echo(f"run-manager: {error}", err=True)
        return EXIT_RUN_FAILED
    dashboard = Dashboard()
    wallet = settings.wallet_bytes()
    if wallet is not None:
        dashboard.wallet.address = keypair_public_key(wallet)
    rewards = None  # the Wallet panel's rewards and its claim: Solana runs with a wallet
    if settings.RPC is not None and wallet is not None and settings.RUN_ID is not None:
        from solders.keypair import Keypair

        from run_manager.rewards import SolanaRewards

        rewards = SolanaRewards(settings.rpc_urls, settings.RUN_ID,
                                Keypair.from_bytes(wallet))
    if config.gpus is not None:
        typer.echo(f"run-manager: {describe_gpus(config.gpus, settings.CLIENT_IMAGE, config.environment)}",
                   err=True)
    metrics = HttpClientMetricsSource(settings.METRICS_LOCAL_PORT)

    try:
        exporter = _start_telemetry(telemetry, settings.run_id, dashboard.wallet.address)
    except OSError as error:
        typer.echo(f"run-manager: --prometheus-port: {error}", err=True)
        return EXIT_CONFIG_ERROR

    def make_supervisor(on_event: Callable[[SupervisorEvent], None]) -> Supervisor:
        if exporter is not None:
            on_event = exporter.wrap(on_event)  # counts starts, exits and restarts
        supervisor = Supervisor(client, coordinator, config, on_event, join_check)
        if exporter is not None:
            supervisor.tracing = exporter.tracing
        return supervisor

    def make_monitor(on_change: Callable[[Part], None]) -> Monitor:
        return Monitor(dashboard, coordinator, metrics, on_change, rpc_url=settings.RPC,
                       rewards=rewards)

    if tui:
        from run_manager.tui.app import RunManagerApp, run_tui

        funds = None  # the Pools & airdrops panel: Solana runs with a wallet
        if settings.RPC is not None and wallet is not None:
            from solders.keypair import Keypair

            from run_manager.funds import WalletFunds

            funds = WalletFunds(settings.rpc_urls, Keypair.from_bytes(wallet),
                                settings.AIRDROP_PROOFS)
        tui_app = RunManagerApp(dashboard, make_supervisor, make_monitor, rewards, funds=funds)

        async def with_tui() -> None:
            try:
                await run_tui(tui_app)
            finally:
                await _close(coordinator, metrics, join_check, rewards, funds)

        asyncio.run(with_tui())
        finished = tui_app.finished
        # The container is gone and the loop gave the signals back: a signal now ends it.
        exit_on_signals(0, lambda sig: f"stopping now ({sig.name})")
    else:

        async def headless() -> SupervisorFinished:
            # The sources' connections live on this loop: close them on it too.
            try:
                return await run_headless(make_supervisor, make_monitor, dashboard)
            finally:
                await _close(coordinator, metrics, join_check, rewards)

        finished = asyncio.run(headless())
        # The loop gave the signals back; the container is gone: a signal now ends it.
        exit_on_signals(0, lambda sig: f"stopping now ({sig.name})")
    if exporter is not None:
        exporter.telemetry.shutdown()
    if finished is not None and finished.failed:
        typer.echo(f"run-manager: {finished.message}", err=True)
        return EXIT_RUN_FAILED
    return 0


def settings_with_chosen_run(settings: RunManagerSettings,
                             join_authority: str | None) -> RunManagerSettings:
    """RUN_ID unset (a Solana run): Psyche's run selection (run_manager.discovery), said
    aloud; the run chosen and the grantee the wallet joins through complete the settings.
    Raises SettingsError (no run to join) or DiscoveryFailed (the cluster did not answer)."""
    if settings.RUN_ID is not None:
        if join_authority is not None:
            typer.echo("run-manager: warning: --authorizer only filters the runs picked when "
                       "RUN_ID is not set; RUN_ID is set, so it is not used", err=True)
        return settings
    from solders.pubkey import Pubkey

    from psyche_common.wallet import keypair_public_key
    from run_manager.discovery import NoJoinableRun, pick_run
    from run_manager.settings import SettingsError

    wallet = settings.wallet_bytes()
    assert wallet is not None  # a Solana run has a wallet: the settings check it
    user = Pubkey.from_string(keypair_public_key(wallet))
    delegate = Pubkey.from_string(settings.AUTHORIZER) if settings.AUTHORIZER else None
    authority = Pubkey.from_string(join_authority) if join_authority else None
    try:
        chosen, candidates = pick_run(settings.rpc_urls, user, authority, delegate)
    except NoJoinableRun as error:
        raise SettingsError([str(error)]) from None
    typer.echo(f"run-manager: RUN_ID not set: {len(candidates)} run(s) open to wallet {user}:",
               err=True)
    for run in candidates:
        typer.echo(f"run-manager:   {run.describe()}", err=True)
    typer.echo(f"run-manager: selected run {chosen.describe()}; joining with "
               f"AUTHORIZER={chosen.grantee}", err=True)
    return settings.model_copy(update={"RUN_ID": chosen.run_id, "AUTHORIZER": str(chosen.grantee)})


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
