"""Where DisTrO's loss goes: an ablation of its settings on the tiny model, as a frontier
of loss ratio (over AdamW) against bytes per step.

    .venv/bin/python -m bench.distro_frontier [--steps 480] [--out bench/results]

Each setting changes one thing from Psyche's (decay 0.999, top-k 8, chunk 64, 1-bit,
lr 2e-3, warm-up 5%) or combines the changes that helped; every run trains the same
samples from the same weights as the AdamW baseline (bench/optimizers.py's setup).
Writes OUT/distro_frontier.md (the table) and OUT/distro_frontier.png (the frontier), and
prints, last, one JSON line: adamw_val_loss and, per setting, val_loss, loss_ratio,
bytes_per_step, bytes_ratio. Each run is also appended to OUT/distro_frontier.jsonl as it
ends; a rerun with the same arguments skips the settings already there (it takes tens of
minutes on a CPU).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import transformers

from client_image.training.defaults import ADAMW_LR, DISTRO_LR, DISTRO_PSYCHE
from client_image.training.simulate import (
    Simulation,
    SimulationConfig,
    default_schedule,
    validation_loss,
)
from coordinator.config import CosineLR

ROOT = Path(__file__).resolve().parent.parent

# name -> (DistroOptimizer overrides, lr, warm-up fraction)
SETTINGS: dict[str, tuple[dict[str, Any], float, float]] = {
    "psyche": ({}, DISTRO_LR, 0.05),
    "decay 0.99": ({"compression_decay": 0.99}, DISTRO_LR, 0.05),
    "decay 0.95": ({"compression_decay": 0.95}, DISTRO_LR, 0.05),
    "decay 0.95, lr 1e-3": ({"compression_decay": 0.95}, 1e-3, 0.05),
    "decay 0.95, lr 4e-3": ({"compression_decay": 0.95}, 4e-3, 0.05),
    "decay 0.95, warm-up 15%": ({"compression_decay": 0.95}, DISTRO_LR, 0.15),
    "lr 4e-3": ({}, 4e-3, 0.05),
    "decay 0.95, lr 8e-3": ({"compression_decay": 0.95}, 8e-3, 0.05),
    "decay 0.95, lr 4e-3, warm-up 15%": ({"compression_decay": 0.95}, 4e-3, 0.15),
    "decay 0.9, lr 4e-3": ({"compression_decay": 0.9}, 4e-3, 0.05),
    "decay 0.95, top-k 16": ({"compression_decay": 0.95, "compression_topk": 16}, DISTRO_LR, 0.05),
    "decay 0.95, top-k 32": ({"compression_decay": 0.95, "compression_topk": 32}, DISTRO_LR, 0.05),
    "decay 0.95, chunk 32, top-k 2": ({"compression_decay": 0.95, "compression_chunk": 32,
                           "compression_topk": 2}, DISTRO_LR, 0.05),
    "decay 0.95, bf16 values": ({"compression_decay": 0.95, "quantize_1bit": False}, DISTRO_LR, 0.05),
    "embeddings per token": ({"embeddings_per_token": True}, DISTRO_LR, 0.05),
}


def schedule(steps: int, lr: float, warmup_fraction: float) -> CosineLR:
    warmup = max(1, round(steps * warmup_fraction))
    return CosineLR(base_lr=lr, warmup_init_lr=0.0, final_lr=lr / 10, warmup_steps=warmup,
                    total_steps=steps)


def run(args: argparse.Namespace, optimizer: str, overrides: dict[str, Any], lr: float,
        warmup_fraction: float) -> tuple[float, float]:
    """(validation loss, payload bytes per peer per step)."""
    config = SimulationConfig(model=args.model, data=args.data, steps=args.steps,
                              total_batch=args.total_batch, micro_batch=args.micro_batch,
                              peers=args.peers, optimizer="adamw" if optimizer == "adamw"
                              else "distro", seq_len=args.seq_len, seed=args.seed)
    config.distro = DISTRO_PSYCHE.model_copy(update=overrides)
    config.lr_schedule = (default_schedule("adamw", args.steps, lr) if optimizer == "adamw"
                          else schedule(args.steps, lr, warmup_fraction))
    simulation = Simulation(config)
    payload = sum(report.payload_bytes_per_peer for report in simulation.run())
    val = validation_loss(simulation.model, args.val_data, args.seq_len, samples=args.val_samples)
    return val, payload / args.steps


def write_outputs(out: Path, adamw: float, rows: dict[str, dict[str, float]],
                  dense_bytes: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"AdamW validation loss: {adamw:.4f}; dense fp32 gradient: {dense_bytes} bytes "
             "per worker per step.", "",
             "| setting | val loss | loss ratio | bytes/step | bytes ratio |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {name} | {r['val_loss']:.4f} | {r['loss_ratio']:.4f} | "
              f"{r['bytes_per_step']:.0f} | {r['bytes_ratio']:.0f} |" for name, r in rows.items()]
    (out / "distro_frontier.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 6))
    # Settings that send the same bytes share an x: their labels are stacked apart.
    spacing = 0.0062
    by_x: dict[float, list[tuple[str, dict[str, float]]]] = {}
    for name, r in rows.items():
        by_x.setdefault(round(r["bytes_per_step"], -1), []).append((name, r))
    leftmost = min(by_x)
    for x_key, group in by_x.items():
        label_y = -1.0
        left = x_key == leftmost and len(by_x) > 1  # its labels go left, clear of the next
        for name, r in sorted(group, key=lambda item: item[1]["loss_ratio"]):
            x, y = r["bytes_per_step"], r["loss_ratio"]
            label_y = max(y, label_y + spacing)
            axes.scatter(x, y, s=18)
            axes.annotate(name, (x, y), xytext=(x / 1.06 if left else x * 1.06, label_y),
                          fontsize=7, va="center", ha="right" if left else "left",
                          arrowprops={"arrowstyle": "-", "linewidth": 0.4})
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.axvline(dense_bytes / 1000, color="grey", linewidth=0.8, linestyle=":")
    axes.set_xscale("log")
    axes.set_xlabel("bytes sent per worker per step (dotted: 1000x fewer than dense fp32)")
    axes.set_ylabel("validation loss / AdamW's")
    axes.set_title("DisTrO on the tiny model: loss against bytes")
    figure.tight_layout()
    figure.savefig(out / "distro_frontier.png", dpi=120)


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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-samples", type=int, default=256)
    parser.add_argument("--only", nargs="*", default=None, help="setting names to run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "distro_frontier.jsonl"
    same_run = {"steps": args.steps, "peers": args.peers, "total_batch": args.total_batch,
                "seq_len": args.seq_len, "seed": args.seed}
    done = {}
    if log.is_file():
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if entry["run"] == same_run:
                done[entry["name"]] = entry["val_loss"], entry.get("bytes_per_step", 0.0)

    def measured(name: str, optimizer: str, overrides: dict[str, Any], lr: float,
                 warmup: float) -> tuple[float, float]:
        if name not in done:
            val, per_step = run(args, optimizer, overrides, lr, warmup)
            with log.open("a") as out:
                out.write(json.dumps({"run": same_run, "name": name, "val_loss": val,
                                      "bytes_per_step": per_step}) + "\n")
            done[name] = val, per_step
        return done[name]

    adamw, _ = measured("adamw", "adamw", {}, ADAMW_LR, 0.05)
    print(f"adamw val loss {adamw:.4f}", flush=True)
    params = sum(p.numel() for p in Simulation(SimulationConfig(
        model=args.model, data=args.data, steps=1, optimizer="adamw")).model.parameters())
    dense = 4 * params
    rows: dict[str, dict[str, float]] = {}
    for name, (overrides, lr, warmup) in SETTINGS.items():
        if args.only is not None and name not in args.only:
            continue
        val, per_step = measured(name, "distro", overrides, lr, warmup)
        rows[name] = {"val_loss": round(val, 4), "loss_ratio": round(val / adamw, 4),
                      "bytes_per_step": round(per_step, 1),
                      "bytes_ratio": round(dense / per_step, 1)}
        print(f"{name:34s} val {val:.4f} ratio {val / adamw:.4f} bytes/step {per_step:8.0f}",
              flush=True)
    write_outputs(args.out, adamw, rows, dense)
    print(json.dumps({"adamw_val_loss": round(adamw, 4), "steps": args.steps,
                      "settings": rows}))


if __name__ == "__main__":
    main()
