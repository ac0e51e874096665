"""Chaos: the local testnet with clients SIGKILLed and restarted at random. Prints its
figures, then ONE JSON line.

    .venv/bin/python -m bench.chaos [--minutes M] [--clients 3] [--kill-interval 30]
                                    [--total-steps 80] [--epoch-time 30] [--timeout 1200]
                                    [--witness-nodes N] [--spare I ...] [--gcs]

--minutes M: run for M minutes whatever the steps (total_steps raised out of reach), then
stop every process: the issue's measure is `--minutes 10` (a kill every 30 s, 3 clients).
The last step or two in flight when it stops are not counted lost or unapplied.

A real `psyche-coordinator run` and N real `psyche-client train` processes on this
machine (the bundled tiny Llama and data, config/local-testnet with total_steps and
epoch_time raised so the run lasts long enough); every --kill-interval seconds one
client is SIGKILLed and started again at once, until the run finishes.

--gcs: the run's stored checkpoint is a GCS bucket (a gcp-storage-emulator on loopback,
in this process), as a production run's is: it starts from the initial model uploaded
there, every client uploads its cooldown checkpoint (`--gcs-bucket`) and reports it, so
when every holder of the model dies the next epoch starts from the last uploaded
cooldown instead of the initial model. Without it the stored checkpoint never moves.

kills, rejoins       SIGKILLs sent; killed clients seen Healthy in a later epoch
clients_identical    every pair of clients compared at every step both checkpointed
                     (SHA-256 of their safetensors) was identical, and some pair was
checkpoint_pairs_compared
                     how many (step, pair of clients) were compared
final_checkpoints_identical
                     the final checkpoints of the clients that reached the last one
                     are byte-identical (the testnet summary's clients_identical)
checkpoint_steps_compared, checkpoint_steps_differing
                     every step at which two or more clients saved a checkpoint, and
                     those where their safetensors differ (should be none)
steps_lost           steps the coordinator counted with batches to train (the rule the
                     clients apply: a batch assigned, and not one of the epoch's last two
                     apply-only rounds) that no client trained
steps_unapplied      steps some client trained whose results no client applied: the last
                     one or two steps of an epoch cut short (a missing witness quorum,
                     too few clients), dropped as Psyche drops them
models_reset         epochs the coordinator started from the run's stored checkpoint
                     (the initial model without --gcs) although the last epoch's clients
                     held a newer model (seen live by the testnet's observer)
models_reset_with_holder
                     those of them while a client holding that model was alive (listed at
                     the last cooldown and not killed since, or restarted with its own
                     checkpoint of that cooldown on disk): must be 0
models_reset_lossy   (from the clients' logs) epochs after the first that loaded the
                     initial model, throwing away training applied since the last such load
epochs_rolled_back   (--gcs) epochs after the first that started from an uploaded cooldown
                     checkpoint, not the initial model: the dead epoch's steps are lost,
                     the training before it is kept
models_reset_no_holder_left
                     the epochs of models_reset and epochs_rolled_back that came after an
                     epoch that reached its cooldown with no client left (all killed in
                     it): only a stored checkpoint could have kept its training
fallback_epochs      all epochs after the first that started from the stored checkpoint
                     (also those right after another, which lose nothing)
local_resumes        restarted holders that loaded their own checkpoint of the last
                     cooldown because no peer could serve the model
checkpoints_equal_initial
                     checkpoints after step 0 whose weights equal the initial model's (a
                     reset epoch that then applied nothing; undercounts resets)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from local_testnet.audit import (
    checkpoint_agreement,
    checkpoint_pairs,
    checkpoints_equal_initial,
    clients_at_cooldown,
    hub_fallback_epochs,
)
from local_testnet.client_log import client_events
from local_testnet.testnet import Testnet, TestnetOptions, run_headless

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "local-testnet"
BUCKET, PREFIX = "chaos", "checkpoints"


def start_gcs(initial: Path, run_id: str) -> Any:
    """A GCS emulator on a loopback port (the clients inherit STORAGE_EMULATOR_HOST) with
    the initial model uploaded as the run's step-0 checkpoint."""
    import logging
    import os
    import socket

    from gcp_storage_emulator.server import create_server
    from google.cloud import storage

    from client_image.training.gcs_checkpoint import upload_checkpoint_to_gcs

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    client = storage.Client.create_anonymous_client()
    client.create_bucket(BUCKET)
    upload_checkpoint_to_gcs(initial, BUCKET, PREFIX, run_id=run_id, epoch=0, step=0,
                             client=client)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=None,
                        help="run this long (the run never finishes by itself), then stop")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--kill-interval", type=float, default=30.0)
    parser.add_argument("--total-steps", type=int, default=80)
    parser.add_argument("--epoch-time", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--witness-nodes", type=int, default=None,
                        help="override the config's witness_nodes (0: every client witnesses)")
    parser.add_argument("--spare", type=int, nargs="*", default=[],
                        help="clients (1..N) never killed: the run's model always has a "
                             "living holder")
    parser.add_argument("--server-port", type=int, default=20400)
    parser.add_argument("--gcs", action="store_true",
                        help="store checkpoints in a GCS bucket (a loopback emulator)")
    args = parser.parse_args()
    if args.minutes is not None:
        if args.minutes <= 0:
            parser.error(f"--minutes must be positive, not {args.minutes}")
        args.timeout = args.minutes * 60
        args.total_steps = 100_000  # out of reach: the time ends the run

    work = Path(tempfile.mkdtemp(prefix="psyche-chaos-"))
    config = work / "config"
    config.mkdir()
    state = tomllib.loads((CONFIG / "state.toml").read_text())
    state["config"].update(total_steps=args.total_steps, epoch_time=args.epoch_time,
                           init_min_clients=args.clients)
    if args.witness_nodes is not None:
        state["config"]["witness_nodes"] = args.witness_nodes
    checkpoint = state["model"]["LLM"]["checkpoint"]["Hub"]
    initial = ROOT / checkpoint["repo_id"] / "model.safetensors"
    checkpoint["repo_id"] = str(ROOT / checkpoint["repo_id"])
    client_args = ["--keep-steps", "1000"]  # every epoch's checkpoint stays to compare
    emulator = None
    if args.gcs:
        emulator = start_gcs(Path(checkpoint["repo_id"]), state["run_id"])
        state["model"]["LLM"]["checkpoint"] = {"Gcs": {"bucket": BUCKET, "prefix": PREFIX}}
        client_args += ["--gcs-bucket", BUCKET, "--gcs-prefix", PREFIX]
    (config / "state.toml").write_text(tomli_w.dumps(state))
    data = tomllib.loads((CONFIG / "data.toml").read_text())
    data["dir"] = str((CONFIG / data["dir"]).resolve())
    (config / "data.toml").write_text(tomli_w.dumps(data))

    testnet = Testnet(TestnetOptions(
        num_clients=args.clients, config_path=config, work_dir=work / "run",
        server_port=args.server_port, data_port=args.server_port + 1, random_kill_num=1,
        random_kill_interval_s=args.kill_interval, timeout_s=args.timeout,
        allowed_to_kill=[i for i in range(1, args.clients + 1) if i not in args.spare],
        client_args=client_args))
    try:
        summary = asyncio.run(run_headless(testnet))
    finally:
        if emulator is not None:
            emulator.stop()
    expected = sorted(step for step, has in testnet.trainable.items() if has)
    # Stopped by --minutes: the round in flight was not trained (or applied) yet.
    in_flight = summary["final_step"] if not summary["finished"] else 1 << 62
    lost = [step for step in testnet.untrained_steps() if step < in_flight]
    equal_initial, examined = checkpoints_equal_initial(work / "run", args.clients, initial)
    fallbacks = hub_fallback_epochs(work / "run", args.clients)
    lossy = hub_fallback_epochs(work / "run", args.clients, lossy_only=True,
                                initial_only=True)
    lossy_all = hub_fallback_epochs(work / "run", args.clients, lossy_only=True)
    rolled_back = sorted(set(lossy_all) - set(lossy))
    holders = clients_at_cooldown(work / "run", args.clients)
    no_holder_left = [epoch for epoch in lossy_all if holders.get(epoch - 1) == 0]
    compared, differing = checkpoint_agreement(work / "run", args.clients)
    resumed = sum(1 for i in range(1, args.clients + 1)
                  for event in client_events(work / "run", i, "model_loaded")
                  if event.get("source") == "local")
    trained = {event["step"] for i in range(1, args.clients + 1)
               for event in client_events(work / "run", i, "trained")}
    applied = {event["of_step"] for i in range(1, args.clients + 1)
               for event in client_events(work / "run", i, "applied")
               if (event.get("results") or 0) > 0}
    unapplied = sorted(step for step in trained - applied if step < in_flight - 1)
    pairs_compared, pairs_differing = checkpoint_pairs(work / "run", args.clients)
    identical = pairs_compared > 0 and not pairs_differing
    print(f"run: {json.dumps(summary)}")
    print(f"steps with batches: {len(expected)}, trained by someone: "
          f"{len(expected) - len(lost)}, lost: {lost}")
    print(f"steps trained but never applied (an epoch cut short drops its last one or two "
          f"steps' results, as Psyche's does): {unapplied}")
    print(f"epochs restarted from the stored (initial) model: {fallbacks}, "
          f"of which went back to the initial model, throwing applied training away: "
          f"{lossy}, after an epoch whose every client was killed before its cooldown (no "
          f"holder left): {no_holder_left}; to an uploaded cooldown (the dead epoch's "
          f"steps lost): {rolled_back}")
    print(f"checkpoints after step 0: {examined}, equal to the initial model: {equal_initial}")
    print(f"steps checkpointed by 2+ clients: {compared}, differing: {differing}; pairs of "
          f"clients compared at each: {pairs_compared}, differing: {pairs_differing}")
    print(f"model resets seen live (epoch, start step, holders alive): "
          f"{[(r.epoch, r.step, r.holders_alive) for r in testnet.model_resets.resets]}")
    print(f"work dir: {work}")
    print(json.dumps({
        "kills": summary["killed"], "rejoins": summary["rejoined"],
        "clients_identical": identical, "checkpoint_pairs_compared": pairs_compared,
        "steps_lost": len(lost), "steps_unapplied": len(unapplied),
        "models_reset": summary["models_reset"],
        "models_reset_with_holder": summary["models_reset_with_holder"],
        "final_checkpoints_identical": summary["clients_identical"],
        "models_reset_lossy": len(lossy), "epochs_rolled_back": len(rolled_back),
        "fallback_epochs": len(fallbacks),
        "models_reset_no_holder_left": len(no_holder_left), "checkpoints_equal_initial": equal_initial,
        "epochs": summary["epochs"], "checkpoint_steps_compared": compared,
        "checkpoint_steps_differing": len(differing), "final_step": summary["final_step"],
        "finished": summary["finished"], "checkpoints_examined": examined,
        "local_resumes": resumed, "wall_s": summary["wall_s"],
    }))


if __name__ == "__main__":
    main()
