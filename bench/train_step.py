"""One client's training step: throughput, DisTrO's overhead, memory, and what bf16 costs
in loss. Prints its figures, then ONE JSON line.

    .venv/bin/python bench/train_step.py [--device auto] [--dtype auto] [--model DIR |
        --generate 125m|1b] [--steps 20] [--batch 8] [--micro-batch 4] [--seq-len 128]

Throughput is the client's real step (client_image.training.DistroTrainer: forward and
backward over micro-batches, then DisTrO's compress/encode and the apply of a result) on
one device. The loss ratios come from two 50-step runs of the bundled tiny model (2
simulated peers, the same data and seed), whatever --model is: fp32 vs bf16 compute, and
fp32 vs bf16 DisTrO buffers (--loss-steps).

device, dtype, params            what ran (dtype: the compute dtype; weights are fp32)
tokens_per_s                     trained tokens per second of whole steps
mfu                              6 x params x tokens_per_s over the device's dense bf16
                                 peak (null on CPU, or a GPU not in PEAK_BF16_FLOPS)
distro_overhead_pct              (compress + encode + decompress + apply) / (fwd + bwd)
peak_mem_mb                      CUDA: max allocated; CPU: the process's max RSS
bf16_vs_fp32_loss_ratio          final loss (mean of the last 10 steps), bf16 / fp32 compute
bf16_buffers_vs_fp32_loss_ratio  the same with DisTrO's delta kept in bf16 instead of fp32
dp_result_max_abs_diff           a client split over D = 2 ranks (FSDP2, two processes,
                                 gloo on CPU) vs one device, same batches, tiny model:
                                 max |decoded result difference| over 4 steps (values mode)
tp_logits_max_abs_diff           T = 2 (tensor parallel) vs one device: max |logits diff|
layouts_weights_identical        after applying the same results, every layout's weights
                                 are bit-identical to one device's (client_image/training/
                                 layout_check.py)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# bench/coordinator.py would shadow the coordinator package: the repository root first.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402

from client_image.host import resolve_device  # noqa: E402
from client_image.training import DistroTrainer, load_causal_lm  # noqa: E402
from client_image.training.layout_check import check_layout  # noqa: E402
from client_image.training.parallel import ParallelDims  # noqa: E402
from client_image.training.precision import (  # noqa: E402
    ComputeDType,
    configure_backends,
    resolve_compute_dtype,
)
from client_image.training.simulate import Simulation, SimulationConfig  # noqa: E402
from client_image.training.trainer import Timings  # noqa: E402
from coordinator.config import CosineLR, DistroOptimizer  # noqa: E402

TINY = ROOT / "assets" / "tiny-llama"
DATA = ROOT / "assets" / "data" / "train"
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}
GENERATED: dict[str, dict[str, Any]] = {  # Llama shapes, random init (no download): for a GPU
    "125m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
             "num_attention_heads": 12, "num_key_value_heads": 12},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8},
}


def generated_model(size: str, directory: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, max_position_embeddings=4096,
                         tie_word_embeddings=False, **GENERATED[size])
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def throughput(args: argparse.Namespace, model_dir: Path, device: str,
               compute: ComputeDType) -> dict[str, float | int | str | None]:
    model = load_causal_lm(model_dir, device=device)
    vocab = int(getattr(model.config, "vocab_size"))  # noqa: B009 (nn.Module types .config as a tensor)
    optimizer = DistroOptimizer(compression_decay=0.999, compression_topk=8,
                                compression_chunk=64, quantize_1bit=True, clip_grad_norm=1.0)
    schedule = CosineLR(base_lr=4e-4, warmup_init_lr=0.0, final_lr=4e-5, warmup_steps=2,
                        total_steps=args.steps + 10)
    trainer = DistroTrainer(model, optimizer, schedule, micro_batch_size=args.micro_batch,
                            compute=compute)
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (args.batch, args.seq_len), generator=generator)
               for _ in range(args.steps + 2)]
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    payloads: dict[int, bytes] = {}
    started = None
    for step, batch in enumerate(batches):
        if step == 2:  # two warm-up steps (allocator, kernels) left out of the timing
            trainer.timings = Timings()
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
        if step - 2 in payloads:
            trainer.apply(step, [trainer.decode(payloads.pop(step - 2))])
        out = trainer.train(step, batch.to(device), batch_id=(step, step))
        assert out.payload is not None
        payloads[step] = out.payload
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    assert started is not None
    seconds = time.perf_counter() - started
    timings = trainer.timings
    tokens_per_s = args.steps * args.batch * args.seq_len / seconds
    params = sum(p.numel() for p in model.parameters())
    overhead = (timings.compress_s + timings.decompress_s + timings.apply_s) / max(
        timings.forward_backward_s, 1e-9)
    name = torch.cuda.get_device_name() if torch.device(device).type == "cuda" else "cpu"
    peak = next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
    if torch.device(device).type == "cuda":
        peak_mem = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mem = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "device_name": name, "params": params, "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(6 * params * tokens_per_s / peak, 4) if peak else None,
        "distro_overhead_pct": round(100 * overhead, 2), "peak_mem_mb": round(peak_mem, 1),
    }


def final_loss(device: str, steps: int, **overrides: object) -> float:
    config = SimulationConfig(model=TINY, data=DATA, steps=steps, total_batch=4, micro_batch=2,
                              peers=2, seq_len=64, device=device, **overrides)  # type: ignore[arg-type]  # overrides are SimulationConfig fields
    losses = [report.loss for report in Simulation(config).run()]
    tail = losses[-10:]
    return sum(tail) / len(tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp32"))
    parser.add_argument("--model", type=Path, default=TINY)
    parser.add_argument("--generate", choices=sorted(GENERATED), default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--loss-steps", type=int, default=50,
                        help="steps of the tiny-model runs behind the loss ratios")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    device = resolve_device(args.device)  # the client's rule: auto is CUDA when present
    compute = resolve_compute_dtype(args.dtype, device)
    configure_backends(device)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = generated_model(args.generate, Path(scratch)) if args.generate else args.model
        speed = throughput(args, model_dir, device, compute)
    print(f"{speed['device_name']}: {speed['params']:,} parameters, {compute} compute: "
          f"{speed['tokens_per_s']:,} tokens/s, DisTrO overhead {speed['distro_overhead_pct']}%, "
          f"peak memory {speed['peak_mem_mb']} MB, MFU {speed['mfu']}")
    fp32 = final_loss(device, args.loss_steps, compute="fp32")
    bf16 = final_loss(device, args.loss_steps, compute="bf16")
    bf16_buffers = final_loss(device, args.loss_steps, compute="fp32", buffer_dtype="bf16")
    print(f"tiny model, {args.loss_steps} steps: final loss fp32 {fp32:.4f}, bf16 compute {bf16:.4f}, "
          f"bf16 DisTrO buffers {bf16_buffers:.4f}")
    dp = check_layout(ParallelDims(2, 1))
    tp = check_layout(ParallelDims(1, 2))
    print(f"layouts vs one device (tiny model, CPU/gloo): D=2 result diff "
          f"{dp['result_max_abs_diff']:.3g}, grad diff {dp['grad_max_abs_diff']:.3g}; T=2 logits "
          f"diff {tp['logits_max_abs_diff']:.3g}, result diff {tp['result_max_abs_diff']:.3g}; "
          f"weights identical: {dp['weights_identical'] and tp['weights_identical']}")
    print(json.dumps({
        "device": device, "dtype": compute, "params": speed["params"],
        "tokens_per_s": speed["tokens_per_s"], "mfu": speed["mfu"],
        "distro_overhead_pct": speed["distro_overhead_pct"], "peak_mem_mb": speed["peak_mem_mb"],
        "dp_result_max_abs_diff": dp["result_max_abs_diff"],
        "tp_logits_max_abs_diff": tp["logits_max_abs_diff"],
        "layouts_weights_identical": dp["weights_identical"] and tp["weights_identical"],
        "bf16_vs_fp32_loss_ratio": round(bf16 / fp32, 4),
        "bf16_buffers_vs_fp32_loss_ratio": round(bf16_buffers / fp32, 4),
        "model": str(args.generate or args.model.name), "batch": args.batch,
        "micro_batch": args.micro_batch, "seq_len": args.seq_len,
    }))


if __name__ == "__main__":
    main()
