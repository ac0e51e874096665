"""AdamW, DisTrO (Psyche's defaults), tuned DisTrO and SparseLoCo, side by side.

    .venv/bin/python -m bench.optimizers [--steps 480] [--peers 4] [--seeds 0 1 2] ...

Every method trains the bundled tiny Llama on the same samples in the same order (seeded
shuffle) from the same initial weights, `steps` optimizer steps of `total-batch` samples:
AdamW on the whole batch (the dense all-reduce baseline), DisTrO with `peers` workers each
on its share, SparseLoCo with `peers` workers running `inner_steps` AdamW steps per round
(a round's batch is those steps' samples). The schedule is warm-up + cosine over steps
(SparseLoCo's counts inner steps). Validation loss is on the held-out split.

Bytes ratio = dense fp32 gradient bytes per token over bytes sent per token, per worker:

    (4 * params / tokens per worker per step) / (payload bytes / tokens per worker per round)

so SparseLoCo's fewer, larger rounds count. Prints a table per seed, then one JSON line:
adamw_val_loss, distro_val_loss, distro_tuned_val_loss, sparseloco_val_loss (means over
seeds), distro_loss_ratio, distro_tuned_loss_ratio, sparseloco_loss_ratio (each over
AdamW's, mean of the per-seed ratios), distro_bytes_ratio, sparseloco_bytes_ratio, and
per_seed with every figure of every seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import transformers

from client_image.training.defaults import (
    ADAMW_LR,
    DISTRO_LR,
    DISTRO_PSYCHE,
    DISTRO_TUNED,
    DISTRO_TUNED_LR,
    DISTRO_TUNED_WARMUP,
    SPARSELOCO,
)
from client_image.training.simulate import (
    Simulation,
    SimulationConfig,
    default_schedule,
    validation_loss,
)
from coordinator.config import CosineLR

ROOT = Path(__file__).resolve().parent.parent

METHODS = ("adamw", "distro", "distro_tuned", "sparseloco")


@dataclass
class Outcome:
    val_loss: float
    payload_bytes_per_round: float  # per worker, 0 for AdamW
    tokens_per_round: int  # per worker
    wall_s: float
    curve: list[tuple[int, float]]  # (steps trained, validation loss) every --eval-every


def simulate(method: str, seed: int, args: argparse.Namespace) -> Outcome:
    optimizer: Literal["distro", "adamw", "sparseloco"] = (
        "adamw" if method == "adamw" else "sparseloco" if method == "sparseloco" else "distro")
    config = SimulationConfig(
        model=args.model, data=args.data, steps=args.steps, total_batch=args.total_batch,
        micro_batch=args.micro_batch, peers=args.peers, optimizer=optimizer,
        seq_len=args.seq_len, seed=seed, max_epochs=args.max_epochs, device=args.device)
    lr = args.adamw_lr
    if method == "distro":
        config.distro, lr = DISTRO_PSYCHE, args.distro_lr
    elif method == "distro_tuned":
        config.distro, lr = DISTRO_TUNED, args.distro_tuned_lr
    elif method == "sparseloco":
        config.sparseloco = SPARSELOCO.model_copy(update={
            "inner_steps": args.inner_steps, "inner_lr": args.inner_lr,
            "topk_density": args.topk_density, "quant_bits": args.quant_bits,
            "error_decay": args.error_decay, "outer_lr": args.outer_lr})
        lr = args.inner_lr
    config.lr_schedule = default_schedule(optimizer, args.steps, lr)
    if method == "distro_tuned":  # its warm-up is part of the tuning
        warmup = max(1, round(args.steps * args.distro_tuned_warmup))
        config.lr_schedule = CosineLR(base_lr=lr, warmup_init_lr=0.0, final_lr=lr / 10,
                                      warmup_steps=warmup, total_steps=args.steps)
    simulation = Simulation(config)
    started = time.perf_counter()
    payload = 0.0
    curve: list[tuple[int, float]] = []
    steps_per_round = config.steps // config.rounds
    for report in simulation.run():
        payload += report.payload_bytes_per_peer
        trained = (report.step + 1) * steps_per_round
        # Mid-run points see the weights as a client does then: the last two rounds'
        # results not applied yet (the final point is after the flush).
        if args.eval_every and trained % args.eval_every == 0 and trained < config.steps:
            curve.append((trained, round(validation_loss(
                simulation.model, args.val_data, args.seq_len, samples=args.val_samples), 4)))
            print(f"  {method} seed {seed} step {trained}: val loss {curve[-1][1]:.4f}",
                  flush=True)
    wall = time.perf_counter() - started
    val = validation_loss(simulation.model, args.val_data, args.seq_len, samples=args.val_samples)
    curve.append((config.steps, round(val, 4)))
    rounds = config.rounds
    tokens = config.round_batch // args.peers * args.seq_len
    return Outcome(val, payload / rounds, tokens, wall, curve)


def bytes_ratio(outcome: Outcome, params: int, args: argparse.Namespace) -> float:
    dense_per_token = 4 * params / (args.total_batch // args.peers * args.seq_len)
    return dense_per_token / (outcome.payload_bytes_per_round / outcome.tokens_per_round)


def read_outcomes(paths: list[Path]) -> list[dict[str, Any]]:
    """The records --jsonl wrote, in file order."""
    return [json.loads(line) for path in paths
            for line in path.read_text().splitlines() if line.strip()]


def figures_per_seed(outcomes: list[dict[str, Any]]) -> list[dict[str, float]]:
    """One dict per seed: every method's figures, and each method's ratio over AdamW's."""
    by_seed: dict[int, dict[str, float]] = {}
    for record in outcomes:
        seed, method = int(record["seed"]), str(record["method"])
        figures = by_seed.setdefault(seed, {"seed": seed})
        figures[f"{method}_val_loss"] = record["val_loss"]
        figures[f"{method}_wall_s"] = record["wall_s"]
        if method != "adamw":
            figures[f"{method}_bytes_per_round"] = record["bytes_per_round"]
            figures[f"{method}_bytes_ratio"] = record["bytes_ratio"]
    for figures in by_seed.values():
        if "adamw_val_loss" in figures:
            for method in METHODS[1:]:
                if f"{method}_val_loss" in figures:
                    figures[f"{method}_loss_ratio"] = round(
                        figures[f"{method}_val_loss"] / figures["adamw_val_loss"], 4)
    return [by_seed[seed] for seed in sorted(by_seed)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "assets" / "tiny-llama")
    parser.add_argument("--data", type=Path, default=ROOT / "assets" / "data" / "train")
    parser.add_argument("--val-data", type=Path, default=ROOT / "assets" / "data" / "validation")
    parser.add_argument("--steps", type=int, default=480)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--total-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--max-epochs", type=int, default=1,
                        help="passes over the training data allowed (--steps beyond one pass)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--adamw-lr", type=float, default=ADAMW_LR)
    parser.add_argument("--distro-lr", type=float, default=DISTRO_LR)
    parser.add_argument("--distro-tuned-lr", type=float, default=DISTRO_TUNED_LR)
    parser.add_argument("--distro-tuned-warmup", type=float, default=DISTRO_TUNED_WARMUP,
                        help="warm-up, a fraction of the steps (the others: 5%%)")
    parser.add_argument("--inner-steps", type=int, default=SPARSELOCO.inner_steps)
    parser.add_argument("--inner-lr", type=float, default=SPARSELOCO.inner_lr)
    parser.add_argument("--topk-density", type=float, default=SPARSELOCO.topk_density)
    parser.add_argument("--quant-bits", type=int, default=SPARSELOCO.quant_bits)
    parser.add_argument("--error-decay", type=float, default=SPARSELOCO.error_decay)
    parser.add_argument("--outer-lr", type=float, default=SPARSELOCO.outer_lr)
    parser.add_argument("--val-samples", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1 ...")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="also the validation loss every this many steps (a curve)")
    parser.add_argument("--jsonl", type=Path,
                        help="append each (seed, method) outcome to this file as it ends")
    parser.add_argument("--from-jsonl", type=Path, nargs="+",
                        help="train nothing: summarize the outcomes these files hold (runs "
                             "split over processes, e.g. one per method and seed on a GPU)")
    args = parser.parse_args()
    if args.steps % args.inner_steps:
        parser.error(f"--steps {args.steps} must be a multiple of --inner-steps {args.inner_steps}")
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    params = sum(p.numel() for p in Simulation(SimulationConfig(
        model=args.model, data=args.data, steps=1, optimizer="adamw")).model.parameters())
    outcomes = read_outcomes(args.from_jsonl) if args.from_jsonl else []
    if not args.from_jsonl:
        for seed in args.seeds:
            for method in args.methods:
                outcome = simulate(method, seed, args)
                record = {"seed": seed, "method": method, "steps": args.steps,
                          "peers": args.peers, "total_batch": args.total_batch,
                          "seq_len": args.seq_len,
                          "val_loss": round(outcome.val_loss, 4),
                          "wall_s": round(outcome.wall_s, 1),
                          "bytes_per_round": round(outcome.payload_bytes_per_round, 1),
                          "bytes_ratio": (round(bytes_ratio(outcome, params, args), 1)
                                          if method != "adamw" else None),
                          "curve": outcome.curve}
                outcomes.append(record)
                if args.jsonl:
                    with args.jsonl.open("a") as out:
                        out.write(json.dumps(record) + "\n")
                print(f"seed {seed} {method:13s} val loss {outcome.val_loss:.4f} "
                      f"bytes/round {outcome.payload_bytes_per_round:9.1f} "
                      f"({outcome.wall_s:.0f} s)", flush=True)
    per_seed = figures_per_seed(outcomes)

    summary: dict[str, object] = {}
    for key in sorted({k for figures in per_seed for k in figures} - {"seed"}):
        if key.endswith(("_val_loss", "_loss_ratio", "_bytes_ratio")):
            summary[key] = round(statistics.fmean(f[key] for f in per_seed if key in f), 4)
    shape = {"steps": args.steps, "peers": args.peers, "total_batch": args.total_batch,
             "seq_len": args.seq_len}
    for key, default in list(shape.items()):  # the runs' own, when summarizing files
        values = {r.get(key, default) for r in outcomes}
        if len(values) > 1:
            parser.error(f"the outcomes differ in {key}: {sorted(values)}")
        shape[key] = values.pop() if values else default
    summary.update({"params": params, **shape, "seeds": [int(f["seed"]) for f in per_seed],
                    "per_seed": per_seed})
    for key, value in summary.items():
        if key != "per_seed":
            print(f"{key:28s} {value}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
