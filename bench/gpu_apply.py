"""Applying P peers' DisTrO results to a model on one device: seconds and peak extra memory.
Prints one line, then ONE JSON line.

    python -m bench.gpu_apply [--model llama-1b|125m|tiny] [--peers 64] [--device cuda]

The model (random weights, fp32 as the client keeps them) is built on the device; the P
payloads are bench/apply_memory.py's synthetic ones (random indices and signs, 1-bit,
chunk 64, top-k 8: an honest payload's size and shape). After a warm-up apply of one
payload, one DistroTrainer.apply_payloads of all P is timed. Extra memory: on CUDA
max_memory_allocated during the apply minus memory_allocated before it; on CPU the peak
RSS minus the RSS before (/proc/self/clear_refs, as bench/apply_memory.py).

JSON fields: apply_s, apply_peak_extra_gib, peers, params, device_name.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench import apply_memory

ROOT = Path(__file__).resolve().parents[1]

GIB = 2**30


def build_model(name: str, device: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    from bench.gpu_models import LLAMA_1B, LLAMA_125M, TINY

    config = (LlamaConfig(**LLAMA_125M) if name == "125m"
              else AutoConfig.from_pretrained(LLAMA_1B if name == "llama-1b" else TINY))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02, generator=generator)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-1b", choices=("llama-1b", "125m", "tiny"))
    parser.add_argument("--peers", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    from client_image.training.trainer import DistroTrainer
    from coordinator.config import ConstantLR, DistroOptimizer

    cuda = torch.device(args.device).type == "cuda"
    model = build_model(args.model, args.device)
    optimizer = DistroOptimizer(compression_decay=0.999, compression_topk=8,
                                compression_chunk=64, quantize_1bit=True)
    trainer = DistroTrainer(model, optimizer, ConstantLR(base_lr=1e-4, warmup_init_lr=1e-4,
                                                         warmup_steps=0), micro_batch_size=1)
    payloads = apply_memory.synthetic_payloads(trainer, args.peers)
    trainer.apply_payloads(5, payloads[:1])  # what a process sets up once
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM)
        before = apply_memory.rss_mb() * 2**20
    started = time.perf_counter()
    applied = trainer.apply_payloads(5, payloads)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = (torch.cuda.max_memory_allocated() if cuda
            else apply_memory.rss_mb("VmHWM") * 2**20)
    if applied != args.peers:
        raise SystemExit(f"applied {applied} of {args.peers} payloads")
    params = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{name}: {args.model} ({params / 1e6:.0f} M params), {args.peers} peers' results "
          f"({len(payloads[0]) / 2**20:.2f} MiB each) applied in {seconds:.2f} s, "
          f"peak extra {(peak - before) / GIB:.3f} GiB")
    print(json.dumps({"apply_s": round(seconds, 3),
                      "apply_peak_extra_gib": round((peak - before) / GIB, 4),
                      "peers": args.peers, "params": params, "device_name": name}))


if __name__ == "__main__":
    main()
