"""Does a D x T layout train like one device? Run a few DisTrO steps both ways and compare.

    python -m client_image.training.layout_check --dp 2 --tp 1 --model assets/tiny-llama

starts D x T rank processes (gloo on CPU, NCCL on CUDA) on loopback, trains the same
batches with a ShardedDistroTrainer, applies the same peers' results as the one-device
DistroTrainer it is compared with, and prints one JSON line:

    result_max_abs_diff   max |decode(own result) - decode(one device's result)| (values
                          sent, not signs: a 1-bit result hides small differences)
    logits_max_abs_diff   max |logits - one device's logits| on the first batch
    grad_max_abs_diff     max |gradient - one device's| on the first batch (before clipping)
    weights_identical     every weight bit-identical after the steps (the same peers'
                          results applied: layouts must not change the weights)

Used by the tests (tests/training/test_parallel_training.py) and bench/train_step.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from client_image.formats.distro_wire import decode_result
from client_image.training.distro import decompress
from client_image.training.model import load_causal_lm
from client_image.training.parallel import (
    ParallelDims,
    build_mesh,
    dp_slice,
    init_process_group,
    parallelize_llama,
)
from client_image.training.sharded import ShardedDistroTrainer, full_tensor
from client_image.training.trainer import DistroTrainer, trainable_parameters
from coordinator.config import ConstantLR, DistroOptimizer

CHECK_OPTIMIZER = DistroOptimizer(
    compression_decay=0.999, compression_topk=8, compression_chunk=64, quantize_1bit=False,
    clip_grad_norm=1.0, weight_decay=0.1)
CHECK_SCHEDULE = ConstantLR(base_lr=1e-3, warmup_init_lr=0.0, warmup_steps=0)


@dataclass
class Trace:
    """What a run of `exercise` leaves to compare (full tensors, on CPU)."""

    payloads: list[bytes]
    logits: torch.Tensor
    grads: list[torch.Tensor]
    weights: list[torch.Tensor]
    losses: list[float]


def check_batches(vocab: int, steps: int, batch: int, seq_len: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (batch, seq_len), generator=generator) for _ in range(steps)]


def exercise(trainer: DistroTrainer, batches: list[torch.Tensor],
             peer_payloads: list[bytes] | None) -> Trace:
    """Train every batch; from step 2 apply the peers' result of step s-2 first (the
    reference's own, so that both sides apply the same bytes)."""
    model = trainer.model
    first = batches[0]
    if isinstance(trainer, ShardedDistroTrainer):
        share, weight = dp_slice(first, trainer.mesh)
    else:
        share, weight = first, 1.0
    logits_local = model(input_ids=share).logits.detach()
    loss = model(input_ids=share, labels=share).loss * weight
    loss.backward()
    grads = [full_tensor(p.grad).detach().cpu().clone() for _, p in trainable_parameters(model)
             if p.grad is not None]
    logits = _gather_rows(logits_local, trainer)
    for param in trainer.params:
        param.grad = None
    payloads: list[bytes] = []
    losses: list[float] = []
    for step, batch in enumerate(batches):
        if step >= 2:
            source = peer_payloads if peer_payloads is not None else payloads
            trainer.apply(step, [trainer.decode(source[step - 2])])
        output = trainer.train(step, batch, batch_id=(step * len(batch), (step + 1) * len(batch) - 1))
        assert output.payload is not None
        payloads.append(output.payload)
        losses.append(output.loss)
    weights = [full_tensor(p.detach()).cpu().clone() for p in trainer.params]
    return Trace(payloads, logits.cpu(), grads, weights, losses)


def _gather_rows(local: torch.Tensor, trainer: DistroTrainer) -> torch.Tensor:
    """The logits of the whole first batch (each data-parallel rank computed its share)."""
    if not isinstance(trainer, ShardedDistroTrainer) or trainer.mesh["dp"].size() == 1:
        return local
    import torch.distributed as dist

    group = trainer.mesh["dp"].get_group()
    parts: list[object] = [None] * trainer.mesh["dp"].size()
    dist.all_gather_object(parts, local.cpu(), group=group)
    return torch.cat([p for p in parts if isinstance(p, torch.Tensor)])


def compare(trace: Trace, reference: Trace, trainer_plans: list) -> dict[str, float | bool]:
    def dense(payload: bytes) -> list[torch.Tensor]:
        return decompress([decode_result(payload, trainer_plans).tensors], trainer_plans,
                          torch.float32, "cpu")

    result_diff = max(float((a - b).abs().max())
                      for mine, theirs in zip(trace.payloads, reference.payloads, strict=True)
                      for a, b in zip(dense(mine), dense(theirs), strict=True))
    return {
        "payloads_identical": trace.payloads == reference.payloads,
        "result_max_abs_diff": result_diff,
        "logits_max_abs_diff": float((trace.logits - reference.logits).abs().max()),
        "grad_max_abs_diff": max(float((a - b).abs().max())
                                 for a, b in zip(trace.grads, reference.grads, strict=True)),
        "weights_identical": all(torch.equal(a, b)
                                 for a, b in zip(trace.weights, reference.weights, strict=True)),
        "loss_max_abs_diff": max(abs(a - b) for a, b in zip(trace.losses, reference.losses,
                                                            strict=True)),
    }


def one_device_trace(model_dir: str, batches: list[torch.Tensor]) -> tuple[Trace, list]:
    model = load_causal_lm(model_dir, device="cpu")
    trainer = DistroTrainer(model, CHECK_OPTIMIZER, CHECK_SCHEDULE, micro_batch_size=2)
    return exercise(trainer, batches, None), trainer.plans


def rank_main(rank: int, dims: ParallelDims, port: int, model_dir: str, steps: int,
              reference_file: Path, out: Path) -> None:
    """One rank: build the layout, run `exercise` with the reference's payloads."""
    init_process_group(rank, dims.world_size, "127.0.0.1", port, "cpu")
    mesh = build_mesh(dims, "cpu")
    model = load_causal_lm(model_dir, device="cpu")
    parallelize_llama(model, mesh)
    trainer = ShardedDistroTrainer(model, CHECK_OPTIMIZER, CHECK_SCHEDULE, mesh=mesh,
                                   micro_batch_size=2)
    reference = torch.load(reference_file, weights_only=False)
    trace = exercise(trainer, reference["batches"], reference["payloads"])
    if rank == 0:  # a plain dict: this process's Trace class is __main__'s
        torch.save(asdict(trace), out)
    import torch.distributed as dist

    dist.barrier()  # nobody tears down while a peer is still in a collective
    dist.destroy_process_group()


def check_layout(dims: ParallelDims, model_dir: str = "assets/tiny-llama", steps: int = 4,
                 batch: int = 4, seq_len: int = 64, timeout_s: float = 300) -> dict:
    """Run the layout in dims.world_size processes and compare with one device."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    batches = check_batches(vocab, steps, batch, seq_len)
    reference, plans = one_device_trace(model_dir, batches)
    with tempfile.TemporaryDirectory(prefix="psyche-layout-") as scratch:
        reference_file, out = Path(scratch) / "reference.pt", Path(scratch) / "trace.pt"
        torch.save({"batches": batches, "payloads": reference.payloads}, reference_file)
        port = _free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        ranks = [subprocess.Popen(
            [sys.executable, "-m", "client_image.training.layout_check", "--rank", str(rank),
             "--dp", str(dims.dp), "--tp", str(dims.tp), "--port", str(port),
             "--model", model_dir, "--steps", str(steps), "--reference", str(reference_file),
             "--out", str(out)], env=env) for rank in range(dims.world_size)]
        try:
            codes = [p.wait(timeout=timeout_s) for p in ranks]
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            raise RuntimeError(f"layout {dims.dp}x{dims.tp}: rank exit codes {codes}")
        trace = Trace(**torch.load(out, weights_only=False))
    return {"dp": dims.dp, "tp": dims.tp, **compare(trace, reference, plans)}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--model", default="assets/tiny-llama")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--reference", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dims = ParallelDims(args.dp, args.tp)
    if args.rank is None:
        print(json.dumps(check_layout(dims, args.model, args.steps)))
    else:
        rank_main(args.rank, dims, args.port, args.model, args.steps, args.reference, args.out)
        # Done and saved: leave without the interpreter's teardown, where gloo's threads
        # still running can abort the process (exit -6, seen under load in CI).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
