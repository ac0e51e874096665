"""One client's training step: throughput, DisTrO's overhead, memory, and what bf16 costs
in loss. Prints its figures, then ONE JSON line.

    .venv/bin/python -m bench.train_step [--device auto] [--dtype auto] [--model DIR |
        --generate 125m|1b] [--steps 20] [--batch 8] [--micro-batch 4] [--seq-len 128]
        [--peers 1] [--activation-checkpointing] [--speed-only] [--profile FILE]

A --model directory holding only a config.json (config/models/llama-1b) is trained from
random weights. --peers: results applied per step (the step's own, P times). --speed-only
leaves out the loss ratios and layout checks (their fields null); --profile writes a
torch.profiler table of two more steps, by device time (bench/gpu_suite.sh speed).

Throughput is the client's real step (client_image.training.DistroTrainer: forward and
backward over micro-batches, then DisTrO's compress/encode and the apply of a result) on
one device. The loss ratios come from two 50-step runs of the bundled tiny model (2
simulated peers, the same data and seed), whatever --model is: fp32 vs bf16 compute, and
fp32 vs bf16 DisTrO buffers (--loss-steps).

device, dtype, params            what ran (dtype: the compute dtype; weights are fp32)
tokens_per_s                     trained tokens per second of whole steps
mfu                              nanoGPT's (6 x non-embedding params + 12 x layers x heads x
                                 head_dim x seq_len) x tokens_per_s over the device's dense
                                 bf16 peak (client_image/training/flops.py; null on CPU, or
                                 a GPU not in its table)
plan_over_peak                   `psyche-client plan`'s bytes (training/memory_plan.py, no
                                 reserve) over peak_mem_mb: above 1 the plan is cautious
distro_overhead_pct              (compress + encode + decompress + apply) / (fwd + bwd);
                                 on CUDA (whole steps - fwd + bwd alone) / (fwd + bwd alone)
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
distro_ops_per_step, distro_ops_growth, distro_step_over_fwd_bwd_125m
                                 bench/distro_step_cost.py, always on the CPU: the kernels
                                 of one DisTrO step (tiny model), their growth with twice
                                 the layers, and the step's time over forward+backward for
                                 the generated 125m Llama, batch 4 x 512, 16 peers
                                 (--distro-cost-size tiny: the tiny model's; none, or
                                 --speed-only: null)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from client_image.host import resolve_device
from client_image.training import DistroTrainer, load_causal_lm
from client_image.training.flops import mfu, model_flops_per_token, peak_bf16_flops
from client_image.training.layout_check import check_layout
from client_image.training.parallel import ParallelDims
from client_image.training.precision import (
    ComputeDType,
    configure_backends,
    enable_activation_checkpointing,
    resolve_compute_dtype,
)
from client_image.training.simulate import Simulation, SimulationConfig
from client_image.training.trainer import Timings
from coordinator.config import CosineLR, DistroOptimizer

ROOT = Path(__file__).resolve().parent.parent

TINY = ROOT / "assets" / "tiny-llama"
DATA = ROOT / "assets" / "data" / "train"
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


def random_init_model(config_dir: Path, directory: Path) -> Path:
    """A directory with only a config.json (config/models/llama-1b), given random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir)).save_pretrained(
        directory)
    return directory


def planned_bytes(model: torch.nn.Module, args: argparse.Namespace,
                  compute: ComputeDType) -> int:
    """`psyche-client plan`'s total for this step: the model's shape, this bench's DisTrO
    settings and peers, no CUDA reserve (max_memory_allocated does not see the context)."""
    from client_image.training.memory_plan import DistroSettings, RunSettings, plan_memory
    from client_image.training.model_shape import describe_model

    run = RunSettings("bench", args.seq_len, args.peers, DistroSettings(64, 8, True))
    return plan_memory(describe_model(model), run, micro_batch_size=args.micro_batch,
                       compute=compute,
                       activation_checkpointing=args.activation_checkpointing).total


def write_profile(trainer: DistroTrainer, batches: list[torch.Tensor], device: str,
                  path: Path) -> None:
    """Two more steps under torch.profiler: its table of kernels by self device time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for step, batch in enumerate(batches, start=10_000):
            trainer.train(step, batch.to(device), batch_id=(step, step))
        if cuda:
            torch.cuda.synchronize()
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.key_averages().table(sort_by=sort, row_limit=40) + "\n")


def forward_backward_seconds(trainer: DistroTrainer, batches: list[torch.Tensor],
                             device: str) -> float:
    """The trainer's loss function (forward and backward over its micro-batches) alone on
    `batches`, synchronized: what a step would cost without DisTrO."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for batch in batches:
        for param in params:
            param.grad = None
        trainer.loss_fn(trainer.model, batch.to(device), trainer.micro_batch_size,
                        trainer.compute)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started


def throughput(args: argparse.Namespace, model_dir: Path, device: str,
               compute: ComputeDType) -> dict[str, float | int | str | None]:
    model = load_causal_lm(model_dir, device=device)
    if args.activation_checkpointing:
        enable_activation_checkpointing(model)
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
            trainer.apply_payloads(step, [payloads.pop(step - 2)] * args.peers)
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
    if torch.device(device).type == "cuda":
        # The trainer's phase timers see kernel launches, not their ends: on CUDA the
        # overhead is the whole step's time over forward/backward alone, synchronized.
        fwd_bwd = forward_backward_seconds(trainer, batches[2:], device)
        overhead = (seconds - fwd_bwd) / fwd_bwd
    name = torch.cuda.get_device_name() if torch.device(device).type == "cuda" else "cpu"
    utilization = mfu(model_flops_per_token(model, args.seq_len), tokens_per_s,
                      peak_bf16_flops(name) if name != "cpu" else None)
    if torch.device(device).type == "cuda":
        peak_mem = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mem = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.profile is not None:
        write_profile(trainer, batches[:2], device, args.profile)
    return {
        "device_name": name, "params": params, "tokens_per_s": round(tokens_per_s, 1),
        "mfu": round(utilization, 4) if utilization is not None else None,
        "distro_overhead_pct": round(100 * overhead, 2), "peak_mem_mb": round(peak_mem, 1),
        "plan_over_peak": round(planned_bytes(model, args, compute) / (peak_mem * 2**20), 3),
    }


def final_loss(device: str, steps: int, **overrides: object) -> float:
    config = SimulationConfig(model=TINY, data=DATA, steps=steps, total_batch=4, micro_batch=2,
                              peers=2, seq_len=64, device=device, **overrides)  # type: ignore[arg-type]  # overrides are SimulationConfig fields
    losses = [report.loss for report in Simulation(config).run()]
    tail = losses[-10:]
    return sum(tail) / len(tail)


QUALITY_FIELDS = ("dp_result_max_abs_diff", "tp_logits_max_abs_diff", "layouts_weights_identical",
                  "bf16_vs_fp32_loss_ratio", "bf16_buffers_vs_fp32_loss_ratio")


def quality_checks(device: str, loss_steps: int) -> dict[str, Any]:
    """The loss ratios (tiny model on `device`) and the layout checks (CPU, gloo)."""
    fp32 = final_loss(device, loss_steps, compute="fp32")
    bf16 = final_loss(device, loss_steps, compute="bf16")
    bf16_buffers = final_loss(device, loss_steps, compute="fp32", buffer_dtype="bf16")
    print(f"tiny model, {loss_steps} steps: final loss fp32 {fp32:.4f}, bf16 compute {bf16:.4f}, "
          f"bf16 DisTrO buffers {bf16_buffers:.4f}")
    dp = check_layout(ParallelDims(2, 1))
    tp = check_layout(ParallelDims(1, 2))
    print(f"layouts vs one device (tiny model, CPU/gloo): D=2 result diff "
          f"{dp['result_max_abs_diff']:.3g}, grad diff {dp['grad_max_abs_diff']:.3g}; T=2 logits "
          f"diff {tp['logits_max_abs_diff']:.3g}, result diff {tp['result_max_abs_diff']:.3g}; "
          f"weights identical: {dp['weights_identical'] and tp['weights_identical']}")
    return {
        "dp_result_max_abs_diff": dp["result_max_abs_diff"],
        "tp_logits_max_abs_diff": tp["logits_max_abs_diff"],
        "layouts_weights_identical": dp["weights_identical"] and tp["weights_identical"],
        "bf16_vs_fp32_loss_ratio": round(bf16 / fp32, 4),
        "bf16_buffers_vs_fp32_loss_ratio": round(bf16_buffers / fp32, 4),
    }


def distro_step_cost(size: str) -> dict[str, Any]:
    """bench/distro_step_cost.py's figures (on the CPU, whatever --device is)."""
    spec = importlib.util.spec_from_file_location("distro_step_cost",
                                                  ROOT / "bench" / "distro_step_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    figures: dict[str, Any] = module.measure(module.parser().parse_args(["--size", size]))
    return figures


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
    parser.add_argument("--peers", type=int, default=1, help="results applied per step")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--speed-only", action="store_true",
                        help="leave out the loss ratios and the layout checks")
    parser.add_argument("--profile", type=Path, default=None,
                        help="write a torch.profiler table of two more steps here")
    parser.add_argument("--distro-cost-size", choices=("125m", "tiny", "none"), default="125m",
                        help="model of distro_step_over_fwd_bwd_<size> (CPU; none: skip)")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    device = resolve_device(args.device)  # the client's rule: auto is CUDA when present
    compute = resolve_compute_dtype(args.dtype, device)
    configure_backends(device)
    with tempfile.TemporaryDirectory() as scratch:
        if args.generate:
            model_dir = generated_model(args.generate, Path(scratch))
        elif not any(args.model.glob("*.safetensors")):
            model_dir = random_init_model(args.model, Path(scratch))
        else:
            model_dir = args.model
        speed = throughput(args, model_dir, device, compute)
    print(f"{speed['device_name']}: {speed['params']:,} parameters, {compute} compute: "
          f"{speed['tokens_per_s']:,} tokens/s, DisTrO overhead {speed['distro_overhead_pct']}%, "
          f"peak memory {speed['peak_mem_mb']} MB, MFU {speed['mfu']}")
    checks = dict.fromkeys(QUALITY_FIELDS) if args.speed_only else quality_checks(
        device, args.loss_steps)
    skip_cost = args.speed_only or args.distro_cost_size == "none"
    distro_cost = {} if skip_cost else distro_step_cost(args.distro_cost_size)
    size = "125m" if args.distro_cost_size == "none" else args.distro_cost_size
    print(json.dumps({
        "device": device, "dtype": compute, "params": speed["params"],
        "tokens_per_s": speed["tokens_per_s"], "mfu": speed["mfu"],
        "plan_over_peak": speed["plan_over_peak"],
        "distro_overhead_pct": speed["distro_overhead_pct"], "peak_mem_mb": speed["peak_mem_mb"],
        **checks,
        "distro_ops_per_step": distro_cost.get("distro_ops_per_step"),
        "distro_ops_growth": distro_cost.get("distro_ops_growth"),
        f"distro_step_over_fwd_bwd_{size}": distro_cost.get(f"distro_step_over_fwd_bwd_{size}"),
        "model": str(args.generate or args.model.name), "batch": args.batch,
        "micro_batch": args.micro_batch, "seq_len": args.seq_len, "peers": args.peers,
        "activation_checkpointing": args.activation_checkpointing,
    }))


if __name__ == "__main__":
    main()
