"""What `psyche-client train` needs besides its options (client_image/cli.py): the D x T
rank setup checked against this host, the relay and GCS flag checks, the Solana wallet's
secret, stopping on signals, and the telemetry's start and last flush.
Import-light like the command line: heavy modules load inside the functions.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import typer

from psyche_common.telemetry.options import TelemetryOptions

if TYPE_CHECKING:
    from client_image.runtime.client import PsycheClient
    from client_image.training.rank_group import RankSetup
    from psyche_common.telemetry import Telemetry


def rank_setup(dp: int, tp: int, local_ranks: int | None, main_port: int,
                device: str) -> RankSetup | None:
    """The D x T ranks of this client, checked against this host now (not at warm-up)."""
    from client_image.training.parallel import ParallelDims, ParallelismError
    from client_image.training.rank_group import DEFAULT_MAIN_PORT, RankSetup

    dims = ParallelDims(dp, tp)
    if not dims.enabled:
        return None
    here = dims.world_size if local_ranks is None else local_ranks
    if device.startswith("cuda"):
        import torch

        if device != "cuda":
            raise typer.BadParameter("with several ranks each uses its own GPU: use --device "
                                     "cuda, not one device", param_hint="--device")
        if here > torch.cuda.device_count():
            raise typer.BadParameter(
                f"{here} ranks on this host, but it has {torch.cuda.device_count()} CUDA "
                "device(s)", param_hint="--data-parallelism/--tensor-parallelism/--local-ranks")
    port = main_port or (DEFAULT_MAIN_PORT if here < dims.world_size else 0)
    try:
        return RankSetup(dims, main_port=port, local_ranks=local_ranks)
    except ParallelismError as exc:
        raise typer.BadParameter(str(exc), param_hint="--local-ranks") from None


def gcs_upload_problem(hub_repo: str | None, gcs_bucket: str | None, gcs_prefix: str | None,
                        checkpoint_dir: Path | None) -> str | None:
    """Why the GCS upload flags cannot be used together as given (None: they can)."""
    if gcs_prefix and not gcs_bucket:
        return "--gcs-prefix names the prefix in --gcs-bucket: give the bucket too"
    if gcs_bucket and hub_repo:
        return "--gcs-bucket and --hub-repo both upload checkpoints: give one of them"
    if gcs_bucket and checkpoint_dir is None:
        return "--gcs-bucket uploads the checkpoints of --checkpoint-dir: give both"
    return None


# Psyche's own relays, its client's default (`--iroh-relay psyche`).
PSYCHE_RELAYS = ("https://use1-1.relay.nousresearch.psyche.iroh.link",
                 "https://usw1-1.relay.nousresearch.psyche.iroh.link")


def relay_choice(value: str) -> tuple[Literal["disabled", "default", "custom"], tuple[str, ...]]:
    """Psyche's values (psyche, n0, disabled), `default` (iroh's, as n0) or relay URLs."""
    if value == "disabled":
        return "disabled", ()
    if value in ("default", "n0"):
        return "default", ()
    if value == "psyche":
        return "custom", PSYCHE_RELAYS
    if value.startswith(("http://", "https://")):
        return "custom", tuple(v for v in value.split(",") if v)
    raise typer.BadParameter(
        "use psyche, n0 (or default), disabled, or relay URLs (https://...)",
        param_hint="--iroh-relay"
    )


# From the first SIGINT, SIGTERM or SIGHUP to the process's end: the client's own bounds
# (client_image/runtime/client.py) fit in it; whatever is still running then is left
# (a checkpoint write is abandoned whole: it is written under a staging name, then renamed).
STOP_WITHIN_S = 8.0
TELEMETRY_FLUSH_S = 2.0  # a stopping client's last export, to an endpoint that may be gone


def stop_on_signals(client: PsycheClient, mode: str) -> None:
    """On the running loop: the first signal says "stopping… (SIGTERM)" and stops the
    client (it withdraws from the run, stops its ranks and P2P node; exit 0), within
    STOP_WITHIN_S at most; a second one ends the process at once."""
    import logging

    from psyche_common.stopping import StopSignals, exit_after, exit_now, say

    signals = StopSignals()

    def on_signal(sig: signal.Signals) -> None:
        if signals.count > 1:
            client.worker.kill_ranks()
            exit_now(0, f"stopping now ({sig.name} again)")
        if mode != "tui":  # a TUI shows the log line
            say(f"stopping… ({sig.name})")
        logging.getLogger("client_image.cli").info("stopping… (%s)", sig.name)
        client.stop(0, withdraw=True)
        exit_after(STOP_WITHIN_S, 0, f"stopping now: the client did not stop within "
                   f"{STOP_WITHIN_S:.0f} s", before=client.worker.kill_ranks)

    signals.on_signal(on_signal)
    signals.install()


def shutdown_telemetry(exporter: Telemetry, stopping: bool) -> None:
    """Flush and stop the exporters; a stopping client waits TELEMETRY_FLUSH_S at most
    (the endpoint may be as gone as the coordinator)."""
    if not stopping:
        exporter.shutdown()
        return
    import threading

    flushing = threading.Thread(target=exporter.shutdown, name="telemetry-shutdown",
                                daemon=True)
    flushing.start()
    flushing.join(TELEMETRY_FLUSH_S)


def start_telemetry(options: TelemetryOptions, client: PsycheClient, node_id: str,
                     run_id: str) -> Telemetry | None:
    """Metrics, spans and logs of this client, when any export is configured."""
    if not options.exports_anything:
        return None
    import os

    from client_image.telemetry import ClientTelemetry
    from psyche_common.telemetry import ServiceIdentity, Telemetry

    try:
        telemetry = Telemetry.start(options, ServiceIdentity(
            "client", node_id, run_id, os.environ.get("CLIENT_VERSION", "")))
    except OSError as exc:
        typer.echo(f"error: --prometheus-port {options.prometheus_port}: {exc}", err=True)
        raise typer.Exit(code=2) from None
    client.telemetry = ClientTelemetry(telemetry, client)
    return telemetry


def wallet_secret(path: Path | None) -> bytes:
    """The 32-byte secret seed of the Solana wallet (file, or RAW_WALLET_PRIVATE_KEY)."""
    import json
    import os

    from psyche_common.wallet import WalletError, load_keypair_bytes

    if path is not None:
        try:
            return load_keypair_bytes(path)[:32]
        except WalletError as exc:
            raise ValueError(f"--wallet-private-key-path: {exc}") from None
    raw = os.environ.get("RAW_WALLET_PRIVATE_KEY", "").strip()
    if not raw:
        raise ValueError("a Solana run needs --wallet-private-key-path or RAW_WALLET_PRIVATE_KEY")
    try:
        if raw.startswith("["):
            try:
                secret = bytes(json.loads(raw))
            except RecursionError:
                raise ValueError("RAW_WALLET_PRIVATE_KEY is JSON nested too deeply") from None
        else:
            from solders.keypair import Keypair

            secret = bytes(Keypair.from_base58_string(raw))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"RAW_WALLET_PRIVATE_KEY is neither a JSON byte array nor base58: {exc}"
                         ) from None
    if len(secret) != 64:
        raise ValueError(f"RAW_WALLET_PRIVATE_KEY must hold 64 bytes, got {len(secret)}")
    return secret[:32]
