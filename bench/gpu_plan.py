"""The device, and the micro-batch and activation checkpointing `psyche-client plan` chooses
for a training step on it. Prints ONE JSON line.

    python -m bench.gpu_plan [--model llama-1b|125m|tiny] [--seq-len 2048] [--batch 16]
        [--peers 16] [--device cuda] [--memory-gib G]

The plan (client_image/training/memory_plan.py, bf16 compute on CUDA, fp32 on CPU, the
bench's DisTrO settings: chunk 64, top-k 8, 1-bit) gives the largest micro-batch that fits
the device's memory (--memory-gib, else the GPU's total, else the host's available RAM)
with and without activation checkpointing. The choice: no checkpointing when a micro-batch
of min(batch, 4) sequences or more fits without it (recomputing costs a third more
compute), else checkpointing if it lets a larger micro-batch fit; the micro-batch is then
the largest divisor of the batch that fits.

JSON fields: device_name, device_slug, torch, cuda, device_memory_gib, micro_batch,
activation_checkpointing, max_micro_batch, max_micro_batch_checkpointed, plan_gib.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.gpu_models import LLAMA_1B, LLAMA_125M, NAMES, TINY
from client_image.training.flops import device_slug
from client_image.training.memory_plan import (
    CUDA_RESERVE_BYTES,
    GIB,
    ComputeDType,
    DistroSettings,
    RunSettings,
    available_system_memory,
    max_micro_batch,
    plan_memory,
)
from client_image.training.model_shape import describe_model, load_model_config, meta_model

ROOT = Path(__file__).resolve().parents[1]


def largest_divisor(batch: int, limit: int) -> int:
    return max((m for m in range(1, min(batch, limit) + 1) if batch % m == 0), default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-1b", choices=NAMES)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--peers", type=int, default=16)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--memory-gib", type=float, default=None)
    args = parser.parse_args()
    cuda = torch.device(args.device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch {torch.__version__} sees no CUDA device")
    name = torch.cuda.get_device_name(args.device) if cuda else "cpu"
    if args.model == "125m":
        from transformers import LlamaConfig

        config = LlamaConfig(**LLAMA_125M)
    else:
        config = load_model_config(LLAMA_1B if args.model == "llama-1b" else TINY)
    shape = describe_model(meta_model(config), args.model)
    if args.memory_gib is not None:
        device_bytes = int(args.memory_gib * GIB)
    elif cuda:
        device_bytes = int(torch.cuda.get_device_properties(args.device).total_memory)
    else:
        device_bytes = available_system_memory()
    run = RunSettings("gpu suite", args.seq_len, args.peers, DistroSettings(64, 8, True))
    compute: ComputeDType = "bf16" if cuda else "fp32"
    reserve = CUDA_RESERVE_BYTES if cuda else 0
    plain = min(args.batch, max_micro_batch(shape, run, device_bytes, compute=compute,
                                            reserve_bytes=reserve))
    checkpointed = min(args.batch, max_micro_batch(shape, run, device_bytes, compute=compute,
                                                   reserve_bytes=reserve,
                                                   activation_checkpointing=True))
    checkpointing = plain < min(args.batch, 4) and checkpointed > plain
    micro = largest_divisor(args.batch, checkpointed if checkpointing else plain)
    if micro == 0:
        raise SystemExit(f"{args.model} does not fit in {device_bytes / GIB:.1f} GiB at "
                         f"seq_len {args.seq_len}, even with activation checkpointing")
    plan = plan_memory(shape, run, micro_batch_size=micro, compute=compute,
                       reserve_bytes=reserve, activation_checkpointing=checkpointing)
    print(json.dumps({
        "device_name": name, "device_slug": device_slug(name) if cuda else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
        "device_memory_gib": round(device_bytes / GIB, 2), "micro_batch": micro,
        "activation_checkpointing": checkpointing, "max_micro_batch": plain,
        "max_micro_batch_checkpointed": checkpointed, "plan_gib": round(plan.total / GIB, 2),
    }))


if __name__ == "__main__":
    main()
