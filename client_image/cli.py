"""``psyche-client``: the client's command line (Typer).

``train`` joins a run through a TCP coordinator or Solana; ``show-identity`` (and Psyche's
``show-static-p2p-identity`` / ``create-static-p2p-identity``, client_image/identity_cli.py)
print the node's keys; ``plan`` and ``predownload`` (client_image/predownload_cli.py) prepare a run.
``train``'s options are the fields of one ``ClientConfig`` (client_image/client_config.py),
made into Typer options by client_image/config_typer.py; each also reads its upper-snake
environment variable, as Psyche's client does (``RUN_ID``, ``MICRO_BATCH_SIZE``…).
Import-light on purpose: heavy modules (torch, iroh) load inside commands.
"""

from __future__ import annotations

from typing import Annotated, cast

import typer

from client_image import identity_cli, plan_cli, predownload_cli, sidecar_cli, train_support
from client_image.client_config import ClientConfig
from client_image.config_typer import client_config_options
from psyche_common.cli_conventions import PROGRAM_SETTINGS, version_option
from psyche_common.stopping import exit_on_signals
from psyche_common.telemetry.options import TelemetryOptions, telemetry_options

app = typer.Typer(
    **PROGRAM_SETTINGS,
    name="psyche-client",
    help="Psyche client: train with a run, share results over iroh.",
    no_args_is_help=True,
)


@app.callback()
def _root(version: Annotated[bool, version_option("psyche-client")] = False) -> None:
    """Psyche client: train with a run, share results over iroh."""


identity_cli.register(app)  # show-identity, show-static-p2p-identity, create-static-p2p-identity
plan_cli.register(app)  # plan: bytes per device, and whether the run fits
predownload_cli.register(app)  # predownload: the run's model and data, before joining
sidecar_cli.register(app)  # more ranks of a client, on another host


@app.command("train")
@telemetry_options
@client_config_options
def train(
    config: ClientConfig,
    *,
    telemetry: TelemetryOptions,
) -> None:
    """Join a run and train until it finishes: a TCP run (--server-addr) or a Solana one (--rpc).

    SIGINT, SIGTERM or SIGHUP stop it cleanly within seconds (exit 0); a second one at once.
    Exit 10: the run wants another client version; 11: the coordinator refused this client
    for good (not authorized, wrong run); 0: the run finished.
    """
    import asyncio
    import os

    # Until the client runs (torch and iroh take seconds to load), a signal ends the process
    # at once: nothing needs stopping yet, and as PID 1 of a container (no init) it would
    # otherwise ignore `docker stop`'s SIGTERM until killed.
    exit_on_signals(0, lambda sig: f"stopping… ({sig.name})")

    connection, checkpoints, evals_config = config.connection, config.checkpoints, config.evals
    logs, tui = config.observability.logs, config.observability.tui
    if tui is not None:  # the spelling every program shares; --logs is Psyche's
        logs = "tui" if tui else ("console" if logs == "tui" else logs)
    if logs not in ("tui", "console", "json", "none"):
        raise typer.BadParameter("use tui, console, json or none", param_hint="--logs")
    if config.p2p.iroh_discovery not in ("local", "n0"):
        raise typer.BadParameter("use local or n0", param_hint="--iroh-discovery")
    for cap, flag in ((config.p2p.max_model_download_mbps, "--max-model-download-mbps"),
                      (config.p2p.max_upload_mbps, "--max-upload-mbps")):
        if cap is not None and not 0 < cap < float("inf"):  # nan fails too
            raise typer.BadParameter(f"{cap:g} is not a rate: give megabits per second above 0",
                                     param_hint=flag)
    relay_mode, relay_urls = train_support.relay_choice(config.p2p.iroh_relay)
    from client_image.verification.adversary import LIVE_ATTACKS
    test_adversary = config.verification.test_adversary
    if test_adversary is not None and test_adversary not in LIVE_ATTACKS:
        raise typer.BadParameter(f"use one of {', '.join(LIVE_ATTACKS)}",
                                 param_hint="--test-adversary")

    from client_image.evals.catalog import parse_task_names
    from client_image.runtime.evaluating import EvalOptions

    try:
        evals = EvalOptions(tasks=parse_task_names(evals_config.eval_tasks or ""),
                            seed=evals_config.eval_seed,
                            max_docs=evals_config.eval_task_max_docs,
                            prompt_task=evals_config.prompt_task,
                            data_dir=evals_config.eval_data_dir)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--eval-tasks") from None
    eval_data_dir = evals_config.eval_data_dir
    if eval_data_dir is not None and not eval_data_dir.is_dir():
        raise typer.BadParameter(f"{eval_data_dir} is not a directory",
                                 param_hint="--eval-data-dir")

    from client_image.backends.base import BackendRejected
    from client_image.p2p import NodeConfig
    from client_image.runtime.client import ClientOptions, PsycheClient
    from client_image.runtime.observability import (
        EventLog,
        LogMode,
        MetricsPortInUse,
        configure_logging,
    )
    from psyche_common.identity import Identity, IdentityError
    from psyche_common.tcp.connection import parse_host_port

    server_addr, rpc = connection.server_addr, connection.rpc
    if (server_addr is None) == (rpc is None):
        typer.echo("error: give exactly one of --server-addr (TCP run) and --rpc (Solana run)",
                   err=True)
        raise typer.Exit(code=2)
    for url, flag in ((connection.ws_rpc, "--ws-rpc"), (connection.ws_rpc_2, "--ws-rpc-2"),
                      (connection.ws_rpc_3, "--ws-rpc-3")):
        if url is not None and not url.startswith(("ws://", "wss://")):
            typer.echo(f"error: {flag} must be a ws:// or wss:// URL, got {url!r}", err=True)
            raise typer.Exit(code=2)
    if server_addr is not None:
        try:
            parse_host_port(server_addr, "--server-addr")
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--server-addr") from None
    try:
        if rpc is not None:
            # On Solana the wallet signs transactions and names the node: one key.
            identity = Identity(
                train_support.wallet_secret(config.identity.wallet_private_key_path))
        else:
            identity = Identity.load(config.identity.identity_secret_key_path)
    except (IdentityError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(code=2) from None
    from client_image.host import bind_address, resolve_device

    bind_ip, interface = bind_address(config.p2p.bind_p2p_interface)
    training = config.training
    device = resolve_device(training.device)
    config = config.replace(device=device)  # the runtime trains on the device resolved here
    from client_image.training.precision import PrecisionError, resolve_compute_dtype

    try:
        resolve_compute_dtype(training.dtype, device)
    except PrecisionError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dtype") from None
    ranks = train_support.rank_setup(training.data_parallelism, training.tensor_parallelism,
                                     training.local_ranks, training.main_port, device)
    mode = cast(LogMode, logs)  # checked against the four log modes at the top
    configure_logging("none" if mode == "tui" else mode)
    if training.torch_threads:
        import torch

        torch.set_num_threads(training.torch_threads)
    checkpoint_dir, hub_repo = checkpoints.checkpoint_dir, checkpoints.hub_repo
    if hub_repo and checkpoint_dir is None:
        typer.echo("error: --hub-repo uploads the checkpoints of --checkpoint-dir: give both",
                   err=True)
        raise typer.Exit(code=2)
    if upload_problem := train_support.gcs_upload_problem(
            hub_repo, checkpoints.gcs_bucket, checkpoints.gcs_prefix, checkpoint_dir):
        typer.echo(f"error: {upload_problem}", err=True)
        raise typer.Exit(code=2)
    if checkpoint_dir is not None:
        # Checked now, not at the first cooldown: an epoch later every save would fail.
        from client_image.training.checkpoint import checkpoint_dir_problem

        if dir_problem := checkpoint_dir_problem(checkpoint_dir):
            typer.echo(f"error: --checkpoint-dir {dir_problem}", err=True)
            raise typer.Exit(code=2)
    if (events_dir := config.observability.events_dir) is not None:
        from psyche_common.event_files import events_dir_problem

        if events_problem := events_dir_problem(events_dir):
            typer.echo(f"error: --events-dir {events_problem}", err=True)
            raise typer.Exit(code=2)
    options = ClientOptions(
        config=config,
        identity=identity,
        node_config=NodeConfig(
            bind_ip=bind_ip,
            bind_port=config.p2p.bind_p2p_port,
            bind_interface=interface,
            relay_mode=relay_mode,
            relay_urls=relay_urls,
        ),
        ranks=ranks,
        hub_token=os.environ.get("HF_TOKEN") or None,
        client_version=os.environ.get("CLIENT_VERSION") or None,
        evals=evals,
    )
    client = PsycheClient(options, EventLog(mode))
    from client_image.telemetry.wandb_logging import WandbUnavailable, start_wandb

    try:  # before the exporters start: nothing to stop when it fails
        wandb_logger = start_wandb(config.observability, client, identity.node_id,
                                   connection.run_id)
    except WandbUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    exporter = train_support.start_telemetry(telemetry, client, identity.node_id,
                                             connection.run_id)

    async def run() -> int:
        train_support.stop_on_signals(client, mode)
        if mode != "tui":
            return await client.run()
        from client_image.runtime.tui import ClientApp

        return await ClientApp(client).run_async() or 0

    try:
        code = asyncio.run(run())
    except BackendRejected as exc:
        # A code of its own: the run-manager must not restart a client refused for good.
        from psyche_common.exit_codes import CLIENT_EXIT_REFUSED

        typer.echo(f"error: the coordinator refused this client: {exc}", err=True)
        raise typer.Exit(code=CLIENT_EXIT_REFUSED) from None
    except MetricsPortInUse as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    finally:
        # The loop gave the signals back: from here one more ends the process at once.
        exit_on_signals(0, lambda sig: f"stopping now ({sig.name})")
        if exporter is not None:
            train_support.shutdown_telemetry(exporter, stopping=client.stop_event.is_set())
        if wandb_logger is not None:
            wandb_logger.finish()
    raise typer.Exit(code=code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
