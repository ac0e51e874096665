"""AdamW, DisTrO (Psyche's defaults), tuned DisTrO, SparseLoCo, DiLoCo and DeMo, side by side.

    .venv/bin/python -m bench.optimizers [--steps 480] [--peers 4] [--seeds 0 1 2] ...
    .venv/bin/python -m bench.optimizers --smoke          # every path in seconds

Every method trains the bundled tiny Llama on the same samples in the same order (seeded
shuffle) from the same initial weights, `steps` optimizer steps of `total-batch` samples:
AdamW on the whole batch (the dense all-reduce baseline), DisTrO with `peers` workers each
on its share, SparseLoCo with `peers` workers running `inner_steps` AdamW steps per round
(a round's batch is those steps' samples), and the baselines of bench/optimizer_baselines.py:
DiLoCo (SparseLoCo's dense counterpart, the same H and inner AdamW) and DeMo (DisTrO's
predecessor). The schedule is warm-up + cosine over steps (the local methods' counts inner
steps).

Tuning: every method but DisTrO at Psyche's defaults gets a grid of the same size
(--grid-points, GRIDS below), run on the first seed; the setting with the lowest loss on
the tuning half of the validation split is run on the other seeds, and every figure
reported is on the other half (--val-samples sequences each).

Bytes ratio = dense fp32 gradient bytes per token over bytes sent per token, per worker:

    (4 * params / tokens per worker per step) / (payload bytes / tokens per worker per round)

so the local methods' fewer, larger rounds count (AdamW's is 1). Prints a table per run,
then one JSON line: per method <m>_val_loss (mean over seeds), <m>_val_loss_spread (max -
min), <m>_setting (the chosen grid point), <m>_bytes_ratio, <m>_loss_ratio (over AdamW,
mean of the per-seed ratios); sparseloco_vs_diloco, distro_vs_demo, distro_tuned_vs_demo
(means of the per-seed ratios); tuning (every grid point's tuning loss) and per_seed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import transformers

from bench.optimizer_baselines import DeMo, DemoSettings, DiLoCo, DiLoCoSettings, RunShape
from client_image.training.defaults import (
    ADAMW_LR,
    DISTRO_LR,
    DISTRO_PSYCHE,
    DISTRO_TUNED,
    DISTRO_TUNED_LR,
    DISTRO_TUNED_WARMUP,
    SPARSELOCO,
)
from client_image.training.simulate import Simulation, SimulationConfig, default_schedule
from coordinator.config import CosineLR, LRSchedule
from psyche_common.token_files.local import LocalDataProvider

ROOT = Path(__file__).resolve().parent.parent

METHODS = ("adamw", "distro", "distro_tuned", "sparseloco", "diloco", "demo")
# (numerator, denominator) of the ratios the issue asks for, each at the same tokens.
PAIRS = {"sparseloco_vs_diloco": ("sparseloco", "diloco"),
         "distro_vs_demo": ("distro", "demo"),
         "distro_tuned_vs_demo": ("distro_tuned", "demo")}

Setting = dict[str, float]


def grids(args: argparse.Namespace) -> dict[str, list[tuple[str, Setting]]]:
    """Each method's grid, its default first. DisTrO at Psyche's defaults is not tuned (it
    is Psyche's behaviour); tuned DisTrO and DeMo sweep the same rates at the same
    decay and warm-up, so their ratio is the algorithms' alone."""
    def rates(lr: float) -> list[float]:
        return [lr, lr / 2, lr * 2]

    outer = args.outer_lr
    return {
        "adamw": [(f"lr {lr:g}", {"lr": lr}) for lr in rates(args.adamw_lr)],
        "distro": [("psyche", {"lr": args.distro_lr})],
        "distro_tuned": [(f"lr {lr:g}", {"lr": lr}) for lr in rates(args.distro_tuned_lr)],
        "demo": [(f"lr {lr:g}", {"lr": lr}) for lr in rates(args.demo_lr)],
        "sparseloco": [(f"outer lr {o:g}", {"outer_lr": o})
                       for o in (outer, round(outer * 2 / 3, 4), round(outer * 4 / 3, 4))],
        "diloco": [("plain average", {"outer_lr": 1.0, "momentum": 0.0}),
                   ("nesterov lr 0.7 mu 0.9", {"outer_lr": 0.7, "momentum": 0.9}),
                   ("nesterov lr 0.9 mu 0.5", {"outer_lr": 0.9, "momentum": 0.5})],
    }


@dataclass
class Outcome:
    tune_loss: float  # on the tuning half of the validation split
    val_loss: float  # on the reported half
    payload_bytes_per_round: float  # per worker, 0 for AdamW
    tokens_per_round: int  # per worker
    wall_s: float
    curve: list[tuple[int, float]]  # (steps trained, reported loss) every --eval-every


@torch.no_grad()
def split_loss(model: torch.nn.Module, args: argparse.Namespace, split: Literal["tune", "report"],
               micro_batch: int = 16) -> float:
    """Mean next-token cross-entropy over one half of the validation samples (unshuffled):
    the first --val-samples tune, the next --val-samples are reported."""
    provider = LocalDataProvider(args.val_data, args.seq_len)
    first = 0 if split == "tune" else args.val_samples
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = 0.0
    for start in range(first, first + args.val_samples, micro_batch):
        end = min(start + micro_batch, first + args.val_samples) - 1
        batch = provider.get_samples(start, end).to(device)
        total += float(model(input_ids=batch, labels=batch).loss) * (end - start + 1)
    model.train(was_training)
    loss = total / args.val_samples
    if not math.isfinite(loss):
        raise FloatingPointError(f"validation loss is {loss}")
    return loss


def warmup_cosine(lr: float, steps: int, warmup_fraction: float) -> LRSchedule:
    warmup = max(1, round(steps * warmup_fraction))
    return CosineLR(base_lr=lr, warmup_init_lr=0.0, final_lr=lr / 10, warmup_steps=warmup,
                    total_steps=steps)


def trainer_of(method: str, seed: int, args: argparse.Namespace, setting: Setting,
               ) -> tuple[Any, int, int]:
    """(a runner whose run() yields once per round and whose .model is evaluated, rounds,
    samples per round over all workers)."""
    shape = RunShape(model=args.model, data=args.data, steps=args.steps,
                     total_batch=args.total_batch, micro_batch=args.micro_batch,
                     peers=args.peers, seq_len=args.seq_len, seed=seed,
                     max_epochs=args.max_epochs, device=args.device)
    if method == "diloco":
        inner = DiLoCoSettings(inner_steps=args.inner_steps, inner_lr=args.inner_lr,
                               outer_lr=setting["outer_lr"], outer_momentum=setting["momentum"])
        diloco = DiLoCo(shape, inner, default_schedule("sparseloco", args.steps, args.inner_lr))
        return diloco, diloco.rounds, diloco.round_batch
    if method == "demo":
        demo = DeMo(shape, DemoSettings(topk=args.demo_topk, decay=args.demo_decay),
                    warmup_cosine(setting["lr"], args.steps, args.distro_tuned_warmup))
        return demo, demo.rounds, args.total_batch
    optimizer: Literal["distro", "adamw", "sparseloco"] = (
        "adamw" if method == "adamw" else "sparseloco" if method == "sparseloco" else "distro")
    config = SimulationConfig(
        model=args.model, data=args.data, steps=args.steps, total_batch=args.total_batch,
        micro_batch=args.micro_batch, peers=args.peers, optimizer=optimizer,
        seq_len=args.seq_len, seed=seed, max_epochs=args.max_epochs, device=args.device)
    lr = setting.get("lr", args.inner_lr)
    if method == "distro":
        config.distro = DISTRO_PSYCHE
    elif method == "distro_tuned":
        config.distro = DISTRO_TUNED
    elif method == "sparseloco":
        config.sparseloco = SPARSELOCO.model_copy(update={
            "inner_steps": args.inner_steps, "inner_lr": args.inner_lr,
            "topk_density": args.topk_density, "quant_bits": args.quant_bits,
            "chunk": args.chunk,
            "error_decay": args.error_decay, "outer_lr": setting["outer_lr"],
            "outer_momentum": args.outer_momentum, "dense_max_numel": args.dense_max_numel})
    config.lr_schedule = default_schedule(optimizer, args.steps, lr)
    if method == "distro_tuned":  # its warm-up is part of the tuning
        config.lr_schedule = warmup_cosine(lr, args.steps, args.distro_tuned_warmup)
    simulation = Simulation(config)
    return simulation, config.rounds, config.round_batch


def simulate(method: str, seed: int, args: argparse.Namespace, setting: Setting) -> Outcome:
    runner, rounds, round_batch = trainer_of(method, seed, args, setting)
    started = time.perf_counter()
    payload = 0.0
    curve: list[tuple[int, float]] = []
    steps_per_round = args.steps // rounds
    for index, step in enumerate(runner.run()):
        if isinstance(runner, Simulation):
            payload += step.payload_bytes_per_peer
        else:
            payload += runner.payload_bytes_per_round
        trained = (index + 1) * steps_per_round
        # Mid-run points see the weights as a client does then (for DisTrO and SparseLoCo
        # the last two rounds' results not applied yet; the final point is after the flush).
        if args.eval_every and trained % args.eval_every == 0 and trained < args.steps:
            curve.append((trained, round(split_loss(runner.model, args, "report"), 4)))
            print(f"  {method} seed {seed} step {trained}: val loss {curve[-1][1]:.4f}",
                  flush=True)
    wall = time.perf_counter() - started
    tune, val = split_loss(runner.model, args, "tune"), split_loss(runner.model, args, "report")
    curve.append((args.steps, round(val, 4)))
    tokens = round_batch // args.peers * args.seq_len
    return Outcome(tune, val, payload / rounds, tokens, wall, curve)


def read_outcomes(paths: list[Path]) -> list[dict[str, Any]]:
    """The records --jsonl wrote, in file order."""
    return [json.loads(line) for path in paths
            for line in path.read_text().splitlines() if line.strip()]


def chosen_settings(outcomes: list[dict[str, Any]]) -> dict[str, str]:
    """Per method, the setting with the lowest tuning loss on the first seed it ran."""
    chosen: dict[str, str] = {}
    for method in {str(r["method"]) for r in outcomes}:
        records = [r for r in outcomes if r["method"] == method]
        first = min(int(r["seed"]) for r in records)
        best = min((r for r in records if int(r["seed"]) == first),
                   key=lambda r: r.get("tune_loss", r["val_loss"]))
        chosen[method] = str(best.get("setting", ""))
    return chosen


def figures_per_seed(outcomes: list[dict[str, Any]]) -> list[dict[str, float]]:
    """One dict per seed: every method's figures at its chosen setting, each method's ratio
    over AdamW's and the ratios of PAIRS."""
    chosen = chosen_settings(outcomes)
    by_seed: dict[int, dict[str, float]] = {}
    for record in outcomes:
        seed, method = int(record["seed"]), str(record["method"])
        if str(record.get("setting", "")) != chosen[method]:
            continue
        figures = by_seed.setdefault(seed, {"seed": seed})
        figures[f"{method}_val_loss"] = record["val_loss"]
        figures[f"{method}_wall_s"] = record["wall_s"]
        figures[f"{method}_bytes_per_round"] = record["bytes_per_round"]
        figures[f"{method}_bytes_ratio"] = record["bytes_ratio"]
    for figures in by_seed.values():
        ratios = {f"{m}_loss_ratio": (m, "adamw") for m in METHODS[1:]} | PAIRS
        for key, (top, bottom) in ratios.items():
            if f"{top}_val_loss" in figures and f"{bottom}_val_loss" in figures:
                figures[key] = round(figures[f"{top}_val_loss"] / figures[f"{bottom}_val_loss"], 4)
    return [by_seed[seed] for seed in sorted(by_seed)]


def summarize(outcomes: list[dict[str, Any]]) -> dict[str, object]:
    """The JSON line's figures (without the run's shape)."""
    per_seed = figures_per_seed(outcomes)
    summary: dict[str, object] = {}
    for key in sorted({k for figures in per_seed for k in figures} - {"seed"}):
        if key.endswith(("_val_loss", "_loss_ratio", "_bytes_ratio")) or key in PAIRS:
            values = [f[key] for f in per_seed if key in f]
            summary[key] = round(statistics.fmean(values), 4)
            if key.endswith("_val_loss") or key in PAIRS:
                summary[f"{key}_spread"] = round(max(values) - min(values), 4)
    for method, setting in sorted(chosen_settings(outcomes).items()):
        summary[f"{method}_setting"] = setting
    tuning: dict[str, dict[str, float]] = {}
    for record in outcomes:
        method = str(record["method"])
        first = min(int(r["seed"]) for r in outcomes if r["method"] == method)
        if int(record["seed"]) == first and "tune_loss" in record:
            tuning.setdefault(method, {})[str(record["setting"])] = record["tune_loss"]
    summary["tuning"] = tuning
    summary["seeds"] = [int(f["seed"]) for f in per_seed]
    summary["per_seed"] = per_seed
    return summary


SMOKE = ["--steps", "4", "--peers", "4", "--total-batch", "4", "--micro-batch", "1",
         "--seq-len", "32", "--val-samples", "4", "--inner-steps", "2", "--seeds", "0", "1",
         "--grid-points", "2"]


def parse_args(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--smoke" in argv:  # arguments given next to --smoke override its own
        argv = SMOKE + argv
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="every method and the tuning on a few steps: " + " ".join(SMOKE))
    parser.add_argument("--model", type=Path, default=ROOT / "assets" / "tiny-llama")
    parser.add_argument("--data", type=Path, default=ROOT / "assets" / "data" / "train")
    parser.add_argument("--val-data", type=Path, default=ROOT / "assets" / "data" / "validation")
    parser.add_argument("--steps", type=int, default=480)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--total-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-epochs", type=int, default=1,
                        help="passes over the training data allowed (--steps beyond one pass)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--grid-points", type=int, default=3,
                        help="settings tried per method on the first seed (1: the defaults)")
    parser.add_argument("--adamw-lr", type=float, default=ADAMW_LR)
    parser.add_argument("--distro-lr", type=float, default=DISTRO_LR)
    parser.add_argument("--distro-tuned-lr", type=float, default=DISTRO_TUNED_LR)
    parser.add_argument("--distro-tuned-warmup", type=float, default=DISTRO_TUNED_WARMUP,
                        help="tuned DisTrO's and DeMo's warm-up, a fraction of the steps "
                             "(the others: 5%%)")
    parser.add_argument("--demo-lr", type=float, default=DISTRO_TUNED_LR)
    parser.add_argument("--demo-decay", type=float, default=DISTRO_TUNED.compression_decay,
                        help="DeMo's momentum decay (tuned DisTrO's, so the two differ only "
                             "in what they send)")
    parser.add_argument("--demo-topk", type=int, default=32, help="DeMo's k per 64 x 64 block")
    parser.add_argument("--inner-steps", type=int, default=SPARSELOCO.inner_steps,
                        help="SparseLoCo's and DiLoCo's H")
    parser.add_argument("--inner-lr", type=float, default=SPARSELOCO.inner_lr)
    parser.add_argument("--topk-density", type=float, default=SPARSELOCO.topk_density)
    parser.add_argument("--quant-bits", type=int, default=SPARSELOCO.quant_bits)
    parser.add_argument("--chunk", type=int, default=SPARSELOCO.chunk,
                        help="SparseLoCo's top-k block side (c x c of a matrix)")
    parser.add_argument("--error-decay", type=float, default=SPARSELOCO.error_decay)
    parser.add_argument("--outer-lr", type=float, default=SPARSELOCO.outer_lr)
    parser.add_argument("--outer-momentum", type=float, default=SPARSELOCO.outer_momentum,
                        help="SparseLoCo's Nesterov outer momentum (0: none)")
    parser.add_argument("--dense-max-numel", type=int, default=SPARSELOCO.dense_max_numel,
                        help="SparseLoCo sends tensors of at most this many elements whole")
    parser.add_argument("--val-samples", type=int, default=128,
                        help="validation sequences to tune on, and as many others reported")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (sign updates move with the count: keep it fixed)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1 ...")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="also the validation loss every this many steps (a curve)")
    parser.add_argument("--jsonl", type=Path,
                        help="append each (seed, method, setting) outcome to this file as it ends")
    parser.add_argument("--from-jsonl", type=Path, nargs="+",
                        help="train nothing: summarize the outcomes these files hold (runs "
                             "split over processes, e.g. one per method and seed on a GPU)")
    args = parser.parse_args(argv)
    if args.steps % args.inner_steps:
        parser.error(f"--steps {args.steps} must be a multiple of --inner-steps {args.inner_steps}")
    if args.grid_points < 1 or args.threads < 1 or args.val_samples < 1:
        parser.error("--grid-points, --threads and --val-samples must be at least 1")
    available = LocalDataProvider(args.val_data, args.seq_len).num_sequences
    if 2 * args.val_samples > available:
        parser.error(f"--val-samples {args.val_samples} twice (tune, report) is more than the "
                     f"{available} validation sequences of {args.seq_len} tokens")
    return parser, args


def main() -> None:
    parser, args = parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    params = sum(p.numel() for p in Simulation(SimulationConfig(
        model=args.model, data=args.data, steps=1, optimizer="adamw")).model.parameters())
    dense_per_token = 4 * params / (args.total_batch // args.peers * args.seq_len)
    outcomes = read_outcomes(args.from_jsonl) if args.from_jsonl else []
    grid = {m: points[: args.grid_points] for m, points in grids(args).items()}

    def run(method: str, seed: int, label: str, setting: Setting) -> dict[str, Any]:
        outcome = simulate(method, seed, args, setting)
        ratio = (1.0 if method == "adamw" else dense_per_token / (
            outcome.payload_bytes_per_round / outcome.tokens_per_round))
        record = {"seed": seed, "method": method, "setting": label, "steps": args.steps,
                  "peers": args.peers, "total_batch": args.total_batch,
                  "seq_len": args.seq_len, "inner_steps": args.inner_steps,
                  "tune_loss": round(outcome.tune_loss, 4),
                  "val_loss": round(outcome.val_loss, 4), "wall_s": round(outcome.wall_s, 1),
                  "bytes_per_round": round(outcome.payload_bytes_per_round, 1),
                  "bytes_ratio": round(ratio, 1), "curve": outcome.curve}
        if args.jsonl:
            with args.jsonl.open("a") as out:
                out.write(json.dumps(record) + "\n")
        print(f"seed {seed} {method:13s} {label:24s} tune {outcome.tune_loss:.4f} "
              f"val {outcome.val_loss:.4f} bytes/round {outcome.payload_bytes_per_round:10.1f} "
              f"ratio {ratio:8.1f} ({outcome.wall_s:.0f} s)", flush=True)
        return record

    if not args.from_jsonl:
        first, *others = args.seeds
        for method in args.methods:
            tried = [run(method, first, label, setting) for label, setting in grid[method]]
            outcomes.extend(tried)
            best = min(tried, key=lambda r: r["tune_loss"])
            setting = dict(grid[method])[best["setting"]]
            outcomes.extend(run(method, seed, best["setting"], setting) for seed in others)

    summary = summarize(outcomes)
    shape = {"steps": args.steps, "peers": args.peers, "total_batch": args.total_batch,
             "seq_len": args.seq_len, "inner_steps": args.inner_steps}
    for key, default in list(shape.items()):  # the runs' own, when summarizing files
        values = {r.get(key, default) for r in outcomes}
        if len(values) > 1:
            parser.error(f"the outcomes differ in {key}: {sorted(values)}")
        shape[key] = values.pop() if values else default
    summary = {**{k: v for k, v in summary.items() if k not in ("tuning", "per_seed")},
               "params": params, **shape, "threads": args.threads,
               "grid_points": args.grid_points, "val_samples": args.val_samples,
               "tuning": summary["tuning"], "per_seed": summary["per_seed"]}
    for key, value in summary.items():
        if key != "per_seed":
            print(f"{key:28s} {value}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
