"""Peak extra memory of applying P peers' DisTrO results to a model of M parameters.
Prints one line per case, then ONE JSON line.

    .venv/bin/python -m bench.apply_memory [--models tiny,llama-134m,llama-1b]
                                           [--peers 8,64,256] [--old-peers 8,64]

Each case runs in its own process: the model (random init; `--dtype fp32`, as the client
keeps its weights, or bf16), P wire payloads of synthetic results (random indices and signs, 1-bit,
chunk 64, top-k 8: an honest payload's size and shape; 8 distinct payloads repeated, so
that building them does not dominate), then the peak RSS is reset
(/proc/self/clear_refs) and one apply runs (after a warm-up apply of one payload: a
client applies every round). Extra = peak RSS during the apply - RSS before it.

    new   DistroTrainer.apply_payloads: one parameter of one peer decoded at a time
    old   what the client did before: decode every payload, then apply per parameter

JSON fields: apply_peak_extra_mb_p<P> (the largest model, new path), largest_tensor_mb
(its largest parameter, in its dtype), ratio_p<P> (extra / largest tensor), old_over_new_
<model>_p<P>, apply_seconds_p<P>.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODELS = {
    "tiny": REPO / "assets" / "tiny-llama",
    "llama-134m": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                   "num_attention_heads": 12, "num_key_value_heads": 12, "vocab_size": 32000,
                   "tie_word_embeddings": False},
    "llama-1b": REPO / "config" / "models" / "llama-1b",
}


def rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def build_model(name: str, dtype_name: str):  # type: ignore[no-untyped-def]  # bench helper, transformers types
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    source = MODELS[name]
    if isinstance(source, dict):
        config = LlamaConfig(**source)
    else:
        config = AutoConfig.from_pretrained(source)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)  # touch every page: the weights are part of the baseline
    return model


def synthetic_payloads(trainer, peers: int) -> list[bytes]:  # type: ignore[no-untyped-def]  # bench helper
    import torch

    from client_image.formats.blocks import SparseResult
    from client_image.formats.distro_wire import encode_result

    generator = torch.Generator().manual_seed(0)
    distinct = []
    for nonce in range(min(8, peers)):
        tensors = []
        for plan in trainer.plans:
            stride = max(1, plan.block_numel // plan.topk)
            base = torch.arange(plan.topk) * stride
            jitter = torch.randint(0, stride, (plan.n_blocks, plan.topk), generator=generator)
            idx = (base + jitter).clamp_max(plan.block_numel - 1)
            signs = torch.randint(0, 2, (plan.n_blocks, plan.topk), generator=generator) * 2 - 1
            tensors.append(SparseResult(idx, signs.to(torch.float32)))
        distinct.append(encode_result(tensors, trainer.plans, step=3, trainer_nonce=nonce,
                                      batch_start=nonce, batch_end=nonce, one_bit=True))
    return [distinct[i % len(distinct)] for i in range(peers)]


def run_case(model_name: str, peers: int, path: str, dtype: str) -> dict[str, float]:
    import torch

    from client_image.training.trainer import DistroTrainer
    from coordinator.config import ConstantLR, DistroOptimizer

    torch.set_num_threads(2)
    model = build_model(model_name, dtype)
    optimizer = DistroOptimizer(compression_decay=0.999, compression_topk=8,
                                compression_chunk=64, quantize_1bit=True)
    trainer = DistroTrainer(model, optimizer, ConstantLR(base_lr=1e-4, warmup_init_lr=1e-4,
                                                         warmup_steps=0),
                            micro_batch_size=1, buffer_dtype=torch.bfloat16)
    payloads = synthetic_payloads(trainer, peers)
    largest = max(p.numel() * p.element_size() for p in trainer.params) / 2**20
    # A client applies every round: measure the steady state, after one apply has set up
    # what a process sets up once (thread pools, the DCT bases, the allocator's arenas).
    trainer.apply_payloads(5, payloads[:1])
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM)
    before = rss_mb()
    started = time.perf_counter()
    if path == "new":
        applied = trainer.apply_payloads(5, payloads)
    else:
        decoded = [trainer.decode(p) for p in payloads]
        applied = len(decoded) if trainer.apply(5, decoded) else 0
    seconds = time.perf_counter() - started
    assert applied == peers, applied
    return {"extra_mb": rss_mb("VmHWM") - before, "largest_tensor_mb": largest,
            "seconds": seconds, "params_m": sum(p.numel() for p in trainer.params) / 1e6,
            "payload_mb": len(payloads[0]) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,llama-134m,llama-1b")
    parser.add_argument("--peers", default="8,64,256")
    parser.add_argument("--old-peers", default="8,64", help="the old path needs P decoded "
                        "results in memory: only these P, and not for llama-1b")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="the weights' dtype: fp32 as the client keeps them, or bf16")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # model:peers:path, in a child
    args = parser.parse_args()
    if args.case:
        model_name, peers, path = args.case.split(":")
        print(json.dumps(run_case(model_name, int(peers), path, args.dtype)))
        return
    models = [m for m in args.models.split(",") if m]
    peer_counts = [int(p) for p in args.peers.split(",") if p]
    old_peers = {int(p) for p in args.old_peers.split(",") if p}
    results: dict[tuple[str, int, str], dict[str, float]] = {}
    for model_name in models:
        for peers in peer_counts:
            paths = ["new"] + (["old"] if peers in old_peers and model_name != "llama-1b"
                               else [])
            for path in paths:
                child = subprocess.run(
                    [sys.executable, "-m", "bench.apply_memory", "--case",
                     f"{model_name}:{peers}:{path}", "--dtype", args.dtype],
                    capture_output=True, text=True, check=False, cwd=REPO)
                if child.returncode != 0:
                    print(f"{model_name} P={peers} {path}: failed\n{child.stderr[-2000:]}")
                    continue
                result = json.loads(child.stdout.strip().splitlines()[-1])
                results[(model_name, peers, path)] = result
                print(f"{model_name:>11} ({result['params_m']:.0f} M params, payload "
                      f"{result['payload_mb']:.2f} MB) P={peers:>3} {path}: extra "
                      f"{result['extra_mb']:8.1f} MB = {result['extra_mb'] / result['largest_tensor_mb']:5.2f}"
                      f" x largest tensor ({result['largest_tensor_mb']:.1f} MB), "
                      f"{result['seconds']:.1f} s", flush=True)
    largest_model = models[-1]
    report: dict[str, float | str | None] = {"dtype": args.dtype}
    for peers in peer_counts:
        new = results.get((largest_model, peers, "new"))
        report[f"apply_peak_extra_mb_p{peers}"] = round(new["extra_mb"], 1) if new else None
        report[f"ratio_p{peers}"] = (round(new["extra_mb"] / new["largest_tensor_mb"], 2)
                                     if new else None)
        report[f"apply_seconds_p{peers}"] = round(new["seconds"], 1) if new else None
    any_new = next((r for (m, _, p), r in results.items() if m == largest_model), None)
    report["largest_tensor_mb"] = round(any_new["largest_tensor_mb"], 1) if any_new else None
    for (model_name, peers, path), old in results.items():
        new = results.get((model_name, peers, "new"))
        if path == "old" and new:
            report[f"old_over_new_{model_name}_p{peers}"] = round(
                old["extra_mb"] / max(new["extra_mb"], 0.1), 2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
