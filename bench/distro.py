"""DisTrO vs AdamW on the tiny model and bundled data, with P simulated peers.

    .venv/bin/python -m bench.distro [--steps 300] [--peers 4] [--device cpu|cuda] ...

Both optimizers see the same data in the same order (seeded ChaCha8 shuffle) from the
same initial weights, with a warm-up + cosine schedule at their tuned peak rates. Prints
the figures, then one JSON line:

    params, payload_bytes_per_peer_step, dense_fp32_bytes_per_step, compression_ratio,
    val_loss_distro, val_loss_adamw, loss_ratio, optimizer_overhead_pct, ...

optimizer_overhead_pct = DisTrO's (compress + decompress + apply) time over its
forward + backward time, summed over all peers.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Literal

import torch
import transformers

from client_image.training.defaults import DISTRO_PSYCHE
from client_image.training.simulate import (
    DEFAULT_ADAMW_LR,
    DEFAULT_DISTRO_LR,
    Simulation,
    SimulationConfig,
    default_schedule,
    validation_loss,
)

ROOT = Path(__file__).resolve().parent.parent


def run(optimizer: Literal["distro", "adamw"],
        args: argparse.Namespace) -> tuple[Simulation, float, float, float]:
    config = SimulationConfig(
        model=args.model,
        data=args.data,
        steps=args.steps,
        total_batch=args.total_batch,
        micro_batch=args.micro_batch,
        peers=args.peers,
        optimizer=optimizer,
        seq_len=args.seq_len,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
    )
    config.distro = config.distro.model_copy(
        update={
            "compression_topk": args.topk,
            "compression_chunk": args.chunk,
            "quantize_1bit": not args.no_quantize,
            "compression_decay": args.compression_decay,
        }
    )
    lr = args.distro_lr if optimizer == "distro" else args.adamw_lr
    config.lr_schedule = default_schedule(optimizer, args.steps, lr)
    simulation = Simulation(config)
    started = time.perf_counter()
    payload_total, last_loss = 0.0, 0.0
    for report in simulation.run():
        payload_total += report.payload_bytes_per_peer
        last_loss = report.loss
        if report.step % max(1, args.steps // 10) == 0 or report.step == args.steps - 1:
            print(
                f"{optimizer:6s} step {report.step:4d} loss {report.loss:.4f} "
                f"bytes/peer {report.payload_bytes_per_peer:.0f}",
                flush=True,
            )
    elapsed = time.perf_counter() - started
    val = validation_loss(simulation.model, args.val_data, args.seq_len, samples=args.val_samples)
    print(
        f"{optimizer:6s} val loss {val:.4f} (train {last_loss:.4f}) in {elapsed:.1f}s", flush=True
    )
    return simulation, val, payload_total / args.steps, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "assets" / "tiny-llama")
    parser.add_argument("--data", type=Path, default=ROOT / "assets" / "data" / "train")
    parser.add_argument("--val-data", type=Path, default=ROOT / "assets" / "data" / "validation")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--total-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--topk", type=int, default=DISTRO_PSYCHE.compression_topk)
    parser.add_argument("--chunk", type=int, default=DISTRO_PSYCHE.compression_chunk)
    parser.add_argument("--compression-decay", type=float,
                        default=DISTRO_PSYCHE.compression_decay)
    parser.add_argument("--no-quantize", action="store_true", help="send bf16 values, not signs")
    parser.add_argument("--distro-lr", type=float, default=DEFAULT_DISTRO_LR)
    parser.add_argument("--adamw-lr", type=float, default=DEFAULT_ADAMW_LR)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-samples", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    _adamw, val_adamw, _, adamw_s = run("adamw", args)
    distro, val_distro, payload, distro_s = run("distro", args)
    timings = distro.timings
    dense = distro.params * 4
    figures = {
        "params": distro.params,
        "payload_bytes_per_peer_step": round(payload, 1),
        "dense_fp32_bytes_per_step": dense,
        "compression_ratio": round(dense / payload, 1),
        "val_loss_distro": round(val_distro, 4),
        "val_loss_adamw": round(val_adamw, 4),
        "loss_ratio": round(val_distro / val_adamw, 4),
        "optimizer_overhead_pct": round(100 * timings.optimizer_s / timings.forward_backward_s, 2),
        "compress_s": round(timings.compress_s, 2),
        "decompress_s": round(timings.decompress_s, 2),
        "apply_s": round(timings.apply_s, 2),
        "forward_backward_s": round(timings.forward_backward_s, 2),
        "steps": args.steps,
        "peers": args.peers,
        "total_batch": args.total_batch,
        "seq_len": args.seq_len,
        "topk": args.topk,
        "chunk": args.chunk,
        "quantize_1bit": not args.no_quantize,
        "compression_decay": args.compression_decay,
        "distro_lr": args.distro_lr,
        "adamw_lr": args.adamw_lr,
        "device": args.device,
        "wall_s": {"adamw": round(adamw_s, 1), "distro": round(distro_s, 1)},
    }
    for key, value in figures.items():
        print(f"{key:30s} {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
