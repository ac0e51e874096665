"""``psyche-client``: the client's command line (Typer).

``train`` joins a run through a TCP coordinator or Solana; ``show-identity`` (and Psyche's
``show-static-p2p-identity`` / ``create-static-p2p-identity``, client_image/identity_cli.py)
print the node's keys; ``plan`` and ``predownload`` (client_image/predownload_cli.py) prepare a run.
Every ``train`` option also reads its upper-snake environment variable, as Psyche's
client does (``RUN_ID``, ``MICRO_BATCH_SIZE``, ``DATA_PARALLELISM``…).
Import-light on purpose: heavy modules (torch, iroh) load inside commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer

from client_image import identity_cli, plan_cli, predownload_cli, sidecar_cli, train_support
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
def train(
    run_id: Annotated[str, typer.Option("--run-id", envvar="RUN_ID", help="The run to join.")],
    server_addr: Annotated[
        str | None,
        typer.Option("--server-addr", envvar="SERVER_ADDR", help="TCP run: the coordinator's HOST:PORT."),
    ] = None,
    rpc: Annotated[
        str | None,
        typer.Option("--rpc", envvar="RPC", help="Solana run: JSON-RPC URL of the cluster."),
    ] = None,
    rpc_2: Annotated[
        str | None, typer.Option("--rpc-2", envvar="RPC_2", help="Fallback JSON-RPC URL.")
    ] = None,
    ws_rpc: Annotated[
        str | None,
        typer.Option("--ws-rpc", envvar="WS_RPC",
                     help="Solana run: PubSub WebSocket URL (account subscriptions) "
                          "[default: --rpc as ws://, port + 1]."),
    ] = None,
    ws_rpc_2: Annotated[
        str | None,
        typer.Option("--ws-rpc-2", envvar="WS_RPC_2",
                     help="Fallback WebSocket URL [default: from --rpc-2]."),
    ] = None,
    authorizer: Annotated[
        str | None,
        typer.Option("--authorizer", envvar="AUTHORIZER",
                     help="Solana run: join as a delegate of this authorization grantee."),
    ] = None,
    wallet_private_key_path: Annotated[
        Path | None,
        typer.Option("--wallet-private-key-path", envvar="WALLET_PRIVATE_KEY_PATH",
                     help="Solana run: solana-keygen keypair file; else RAW_WALLET_PRIVATE_KEY."),
    ] = None,
    identity_secret_key_path: Annotated[
        Path | None,
        typer.Option(
            "--identity-secret-key-path",
            envvar="IDENTITY_SECRET_KEY_PATH",
            help="32 raw secret bytes; else RAW_IDENTITY_SECRET_KEY; else a fresh key.",
        ),
    ] = None,
    bind_p2p_port: Annotated[
        int, typer.Option("--bind-p2p-port", envvar="BIND_P2P_PORT", min=0, max=65535)
    ] = 0,
    bind_p2p_interface: Annotated[
        str | None,
        typer.Option(
            "--bind-p2p-interface",
            envvar="BIND_P2P_INTERFACE",
            help="An IP address, or an interface name pattern such as eth*.",
        ),
    ] = None,
    iroh_relay: Annotated[
        str,
        typer.Option("--iroh-relay", envvar="IROH_RELAY",
                     help="psyche (Psyche's relays) | n0 or default (iroh's) | disabled | "
                          "relay URLs"),
    ] = "default",
    iroh_discovery: Annotated[
        str,
        typer.Option(
            "--iroh-discovery",
            envvar="IROH_DISCOVERY",
            help="local: peers' addresses come from the coordinator's client list.",
        ),
    ] = "local",
    device: Annotated[str, typer.Option("--device", envvar="DEVICE")] = "auto",
    micro_batch_size: Annotated[
        int, typer.Option("--micro-batch-size", envvar="MICRO_BATCH_SIZE", min=1,
                          help="sequences per forward/backward; the assigned batch runs in as "
                               "many as needed, gradients accumulating in fp32")
    ] = 1,
    dtype: Annotated[
        str, typer.Option("--dtype", envvar="DTYPE",
                          help="compute dtype: auto (bf16 on CUDA, else fp32) | bf16 | fp32; "
                               "weights stay fp32, so clients of either dtype share one model")
    ] = "auto",
    activation_checkpointing: Annotated[
        bool, typer.Option("--activation-checkpointing/--no-activation-checkpointing",
                           envvar="ACTIVATION_CHECKPOINTING",
                           help="recompute activations in backward: less memory, more compute")
    ] = False,
    data_parallelism: Annotated[
        int, typer.Option("--data-parallelism", envvar="DATA_PARALLELISM", min=1,
                          help="D: ranks that shard the model (FSDP2) and split the batch")
    ] = 1,
    tensor_parallelism: Annotated[
        int, typer.Option("--tensor-parallelism", envvar="TENSOR_PARALLELISM", min=1,
                          help="T: ranks that split each block's attention and MLP")
    ] = 1,
    local_ranks: Annotated[
        int | None, typer.Option("--local-ranks", envvar="LOCAL_RANKS", min=1,
                                 help="of the D x T ranks, how many run on this host (default "
                                      "all); `psyche-client sidecar` runs the others")
    ] = None,
    main_port: Annotated[
        int, typer.Option("--main-port", envvar="PSYCHE_MAIN_PORT", min=0, max=65535,
                          help="the ranks' rendezvous port (0: any free port; sidecars need "
                               "a fixed one)")
    ] = 0,
    checkpoint_dir: Annotated[
        Path | None, typer.Option("--checkpoint-dir", envvar="CHECKPOINT_DIR")
    ] = None,
    hub_repo: Annotated[
        str | None,
        typer.Option("--hub-repo", envvar="HUB_REPO",
                     help="Upload checkpoints to this hub repo; the coordinator accepts "
                          "reports only for the run's own repository."),
    ] = None,
    gcs_bucket: Annotated[
        str | None,
        typer.Option("--gcs-bucket", envvar="GCS_BUCKET",
                     help="Upload checkpoints (and Psyche's manifest.json) to this GCS bucket "
                          "(GOOGLE_APPLICATION_CREDENTIALS); the coordinator accepts reports "
                          "only for the run's own bucket and prefix."),
    ] = None,
    gcs_prefix: Annotated[
        str | None, typer.Option("--gcs-prefix", envvar="GCS_PREFIX",
                                 help="the object name prefix of --gcs-bucket's uploads")
    ] = None,
    keep_steps: Annotated[int, typer.Option("--keep-steps", envvar="KEEP_STEPS", min=1)] = 3,
    delete_old_steps: Annotated[
        bool, typer.Option("--delete-old-steps", envvar="DELETE_OLD_STEPS")
    ] = True,
    max_concurrent_parameter_requests: Annotated[
        int,
        typer.Option(
            "--max-concurrent-parameter-requests", envvar="MAX_CONCURRENT_PARAMETER_REQUESTS", min=1
        ),
    ] = 8,
    write_gradients_dir: Annotated[
        Path | None, typer.Option("--write-gradients-dir", envvar="WRITE_GRADIENTS_DIR")
    ] = None,
    metrics_local_port: Annotated[
        int | None,
        typer.Option("--metrics-local-port", envvar="METRICS_LOCAL_PORT", min=1, max=65535),
    ] = None,
    logs: Annotated[
        str,
        typer.Option(
            "--logs", envvar="LOGS", help="tui | console | json | none"
        ),
    ] = "console",
    tui: Annotated[
        bool | None,
        typer.Option("--tui/--no-tui", show_default=False,
                     help="--tui: --logs tui; --no-tui: console logs instead of a TUI"),
    ] = None,
    torch_threads: Annotated[
        int | None,
        typer.Option(
            "--torch-threads",
            envvar="TORCH_THREADS",
            min=1,
            help="CPU threads for torch (default: torch's choice).",
        ),
    ] = None,
    dummy_training_delay_secs: Annotated[
        float, typer.Option("--dummy-training-delay-secs", envvar="DUMMY_TRAINING_DELAY_SECS",
                            min=0,
                            help="runs of the Dummy optimizer (Psyche's config/test): each "
                                 "step sleeps this long instead of training")
    ] = 0.0,
    test_adversary: Annotated[
        str | None,
        typer.Option("--test-adversary",
                     help="testing verification only: publish dishonest results of this "
                          "kind (random_signs | scaled | stale | zeros | flipped_signs | "
                          "wrong_batch); the run's followers should report this client and "
                          "the coordinator eject it"),
    ] = None,
    eval_tasks: Annotated[
        str | None,
        typer.Option("--eval-tasks", envvar="EVAL_TASKS",
                     help="benchmarks to score the model on between epochs, comma-separated: "
                          "arc_challenge, arc_easy, boolq, ceval_valid, hellaswag, mmlu, "
                          "mmlu_cf, mmlu_pro (5-shot), openbookqa, piqa (docs/evals.md)"),
    ] = None,
    eval_seed: Annotated[
        int, typer.Option("--eval-seed", envvar="EVAL_SEED", min=0,
                          help="picks each task's documents (shuffled with it)")
    ] = 42,
    eval_task_max_docs: Annotated[
        int | None, typer.Option("--eval-task-max-docs", envvar="EVAL_TASK_MAX_DOCS", min=1,
                                 help="documents per task (default: all)")
    ] = None,
    eval_data_dir: Annotated[
        Path | None,
        typer.Option("--eval-data-dir", envvar="EVAL_DATA_DIR",
                     help="<task>.jsonl or <task>.parquet files in the data set's format; "
                          "else the Hugging Face cache, else the bundled samples"),
    ] = None,
    prompt_task: Annotated[
        bool, typer.Option("--prompt-task", envvar="PROMPT_TASK",
                           help="each epoch, log the model's greedy continuation of a prompt")
    ] = False,
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

    if tui is not None:  # the spelling every program shares; --logs is Psyche's
        logs = "tui" if tui else ("console" if logs == "tui" else logs)
    if logs not in ("tui", "console", "json", "none"):
        raise typer.BadParameter("use tui, console, json or none", param_hint="--logs")
    if iroh_discovery not in ("local", "n0"):
        raise typer.BadParameter("use local or n0", param_hint="--iroh-discovery")
    relay_mode, relay_urls = train_support.relay_choice(iroh_relay)
    from client_image.verification.adversary import LIVE_ATTACKS
    if test_adversary is not None and test_adversary not in LIVE_ATTACKS:
        raise typer.BadParameter(f"use one of {', '.join(LIVE_ATTACKS)}",
                                 param_hint="--test-adversary")

    from client_image.evals.catalog import parse_task_names
    from client_image.runtime.evaluating import EvalOptions

    try:
        evals = EvalOptions(tasks=parse_task_names(eval_tasks or ""), seed=eval_seed,
                            max_docs=eval_task_max_docs, prompt_task=prompt_task,
                            data_dir=eval_data_dir)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--eval-tasks") from None
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

    if (server_addr is None) == (rpc is None):
        typer.echo("error: give exactly one of --server-addr (TCP run) and --rpc (Solana run)",
                   err=True)
        raise typer.Exit(code=2)
    for url, flag in ((ws_rpc, "--ws-rpc"), (ws_rpc_2, "--ws-rpc-2")):
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
            identity = Identity(train_support.wallet_secret(wallet_private_key_path))
        else:
            identity = Identity.load(identity_secret_key_path)
    except (IdentityError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(code=2) from None
    from client_image.host import bind_address, resolve_device

    bind_ip, interface = bind_address(bind_p2p_interface)
    device = resolve_device(device)
    from client_image.training.precision import PrecisionError, resolve_compute_dtype

    try:
        resolve_compute_dtype(dtype, device)
    except PrecisionError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dtype") from None
    ranks = train_support.rank_setup(data_parallelism, tensor_parallelism, local_ranks,
                                     main_port, device)
    mode = cast(LogMode, logs)  # checked against the four log modes at the top
    configure_logging("none" if mode == "tui" else mode)
    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    if hub_repo and checkpoint_dir is None:
        typer.echo("error: --hub-repo uploads the checkpoints of --checkpoint-dir: give both",
                   err=True)
        raise typer.Exit(code=2)
    if upload_problem := train_support.gcs_upload_problem(hub_repo, gcs_bucket, gcs_prefix,
                                                          checkpoint_dir):
        typer.echo(f"error: {upload_problem}", err=True)
        raise typer.Exit(code=2)
    if checkpoint_dir is not None:
        # Checked now, not at the first cooldown: an epoch later every save would fail.
        from client_image.training.checkpoint import checkpoint_dir_problem

        if dir_problem := checkpoint_dir_problem(checkpoint_dir):
            typer.echo(f"error: --checkpoint-dir {dir_problem}", err=True)
            raise typer.Exit(code=2)
    options = ClientOptions(
        run_id=run_id,
        server_addr=server_addr,
        rpc=rpc,
        rpc_2=rpc_2,
        ws_rpc=ws_rpc,
        ws_rpc_2=ws_rpc_2,
        authorizer=authorizer,
        identity=identity,
        node_config=NodeConfig(
            bind_ip=bind_ip,
            bind_port=bind_p2p_port,
            bind_interface=interface,
            relay_mode=relay_mode,
            relay_urls=relay_urls,
        ),
        device=device,
        micro_batch_size=micro_batch_size,
        dtype=dtype,
        activation_checkpointing=activation_checkpointing,
        ranks=ranks,
        test_adversary=test_adversary,
        dummy_training_delay_s=dummy_training_delay_secs,
        checkpoint_dir=checkpoint_dir,
        hub_repo=hub_repo,
        hub_token=os.environ.get("HF_TOKEN") or None,
        gcs_bucket=gcs_bucket,
        gcs_prefix=gcs_prefix,
        keep_steps=keep_steps,
        delete_old_steps=delete_old_steps,
        max_concurrent_parameter_requests=max_concurrent_parameter_requests,
        write_gradients_dir=write_gradients_dir,
        metrics_local_port=metrics_local_port,
        client_version=os.environ.get("CLIENT_VERSION") or None,
        evals=evals,
    )
    client = PsycheClient(options, EventLog(mode))
    exporter = train_support.start_telemetry(telemetry, client, identity.node_id, run_id)

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
    raise typer.Exit(code=code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
