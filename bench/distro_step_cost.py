"""What one DisTrO step costs beside forward/backward: its kernel count, and how that count
grows with the number of parameter tensors; and its time over forward+backward.

    .venv/bin/python -m bench.distro_step_cost [--ops-only] [--size 125m|tiny]
        [--batch 4] [--seq-len 512] [--peers 16] [--repeats 1] [--profile TABLE]

Kernel count (`distro_ops_per_step`): torch.profiler over one client step of the bundled
tiny model (DistroTrainer.apply of the peers' results of step s-2, then DistroTrainer.train
of step s), counting the aten operators called by the step itself (the top-level ones:
an operator that another aten operator calls is that operator's work), leaving out the
forward/backward and the gradient clipping (the model's work, not DisTrO's) and the
operators that launch no kernel (views, reshapes without a copy, allocations).
`distro_ops_growth` is that count for the same model with twice the layers, over it:
1.0 when the step's kernels do not depend on how many tensors the model has.

Time (`distro_step_over_fwd_bwd_<size>`): the trainer's own timings (training/trainer.py
Timings) of one step of a generated Llama (bench/train_step.py's shapes, random init) on
this machine's CPU: compress + encode + decode of `--peers` peers' results + apply + the
lookahead, over forward+backward of a batch of `--batch` x `--seq-len` tokens; the best
of `--repeats` steps after one warm-up step.

`--profile TABLE`: one more step after the timed ones, under torch.profiler, its operators
by self CPU time (the forward/backward's included, marked as the range
bench.forward_backward) written to TABLE.

Prints its figures, then ONE JSON line: distro_ops_per_step, distro_ops_growth,
distro_ops_per_step_2x_layers and, unless --ops-only, distro_step_over_fwd_bwd_<size>,
distro_step_s_<size>, fwd_bwd_s_<size>.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.profiler import ProfilerActivity, profile, record_function

from client_image.training import trainer as trainer_module
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer, Timings
from coordinator.config import ConstantLR, DistroOptimizer

ROOT = Path(__file__).resolve().parent.parent

TINY = ROOT / "assets" / "tiny-llama"
MODEL_WORK = "bench.forward_backward"
# Operators that only describe memory (a view, an allocation): no kernel runs for them.
NO_KERNEL = {
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::permute", "aten::slice",
    "aten::select", "aten::as_strided", "aten::expand", "aten::unsqueeze", "aten::squeeze",
    "aten::t", "aten::transpose", "aten::detach", "aten::alias", "aten::split",
    "aten::unbind", "aten::flatten", "aten::narrow", "aten::lift_fresh", "aten::empty",
    "aten::empty_like", "aten::empty_strided", "aten::resolve_conj", "aten::resolve_neg",
    "aten::numpy_T", "aten::chunk", "aten::view_as", "aten::_reshape_alias",
    "aten::split_with_sizes", "aten::contiguous", "aten::to", "aten::_to_copy",
    "aten::result_type",
    "aten::_has_compatible_shallow_copy_type",  # param.data = t: a type check, no kernel
}
# aten::to / aten::contiguous / aten::reshape launch a kernel only through a child (a
# copy); they are counted when one of their children is.
OPTIMIZER = DistroOptimizer(compression_decay=0.999, compression_topk=8, compression_chunk=64,
                            quantize_1bit=True, clip_grad_norm=1.0, weight_decay=0.1)
SCHEDULE = ConstantLR(base_lr=1e-3, warmup_init_lr=1e-3, warmup_steps=0)
GENERATED: dict[str, dict[str, Any]] = {  # bench/train_step.py's 125m Llama
    "125m": {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048,
             "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 12},
}


def _launches_kernel(event: Any) -> bool:
    if event.name.startswith("aten::") and event.name not in NO_KERNEL:
        return True
    return any(_launches_kernel(child) for child in event.cpu_children)


def count_kernels(events: Any) -> int:
    """Top-level aten operators that launch a kernel, outside the model's own work."""
    count = 0
    for event in events:
        if event.cpu_parent is not None or not event.name.startswith("aten::"):
            continue
        count += _launches_kernel(event)
    return count


@contextlib.contextmanager
def model_work_marked(trainer: DistroTrainer) -> Iterator[None]:
    """Forward/backward and clipping run inside one profiler range (not counted)."""
    loss_fn, clip = trainer.loss_fn, trainer_module.clip_gradients

    def marked_loss(*args: Any, **kwargs: Any) -> float:
        with record_function(MODEL_WORK):
            return loss_fn(*args, **kwargs)

    def marked_clip(*args: Any, **kwargs: Any) -> float:
        with record_function(MODEL_WORK):
            return clip(*args, **kwargs)
    trainer.loss_fn = marked_loss
    trainer_module.clip_gradients = marked_clip  # type: ignore[assignment]  # same signature
    try:
        yield
    finally:
        trainer.loss_fn = loss_fn
        trainer_module.clip_gradients = clip


def layered_model(layers: int | None, directory: Path) -> Path:
    """The tiny model with `layers` layers (None: as bundled), random init."""
    if layers is None:
        return TINY
    config = transformers.AutoConfig.from_pretrained(TINY)
    config.num_hidden_layers = layers
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def generated_model(size: str, directory: Path) -> Path:
    config = transformers.LlamaConfig(max_position_embeddings=4096, tie_word_embeddings=False,
                                      **GENERATED[size])
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def peers_and_trainer(model_dir: Path, peers: int, micro_batch_size: int, vocab: int,
                      ) -> tuple[DistroTrainer, list[bytes]]:
    """A trainer that has trained steps 0 and 1 (on a small batch: only their state
    matters), and `peers` copies of its result of step 1, to apply at step 3 (distinct
    bytes are not needed: the decode's work is the same)."""
    trainer = DistroTrainer(load_causal_lm(model_dir, device="cpu"), OPTIMIZER, SCHEDULE,
                            micro_batch_size=micro_batch_size)
    setup = torch.randint(0, vocab, (1, 32), generator=torch.Generator().manual_seed(1))
    for step in range(2):
        out = trainer.train(step, setup, batch_id=(step, step))
    assert out.payload is not None
    return trainer, [out.payload] * peers


def step_ops(model_dir: Path, peers: int = 2) -> int:
    """Kernels of one DisTrO step (apply, then train) of the model in `model_dir`."""
    batch = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(0))
    trainer, payloads = peers_and_trainer(model_dir, peers, 2, 4096)
    results = [trainer.decode(p) for p in payloads]
    with model_work_marked(trainer):
        trainer.apply(3, results)
        trainer.train(3, batch, batch_id=(3, 3))  # warm-up: caches, lazy buffers
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            trainer.apply(3, results)
            trainer.train(3, batch, batch_id=(3, 3))
    return count_kernels(prof.events())


def ops_growth(directory: Path) -> dict[str, float | int]:
    base = step_ops(layered_model(None, directory / "base"))
    layers = int(transformers.AutoConfig.from_pretrained(TINY).num_hidden_layers)
    doubled = step_ops(layered_model(2 * layers, directory / "doubled"))
    return {"distro_ops_per_step": base, "distro_ops_per_step_2x_layers": doubled,
            "distro_ops_growth": round(doubled / base, 3)}


def step_over_fwd_bwd(model_dir: Path, *, peers: int, batch: int, seq_len: int,
                      repeats: int, vocab: int, profile_to: Path | None = None
                      ) -> tuple[float, float]:
    """(DisTrO's step seconds, forward+backward seconds): the best of `repeats` steps."""
    tokens = torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    trainer, payloads = peers_and_trainer(model_dir, peers, batch, vocab)
    best: tuple[float, float] | None = None
    for repeat in range(repeats + 1):
        trainer.timings = Timings()
        step = 3 + repeat
        trainer.apply_payloads(step, [_restamped(p, step - 2) for p in payloads])
        trainer.train(step, tokens, batch_id=(step, step))
        t = trainer.timings
        figures = (t.compress_s + t.decompress_s + t.apply_s, t.forward_backward_s)
        if repeat and (best is None or figures[0] / figures[1] < best[0] / best[1]):
            best = figures
        print(f"  step {step}: DisTrO {figures[0]:.3f} s (compress {t.compress_s:.3f}, decode "
              f"and apply {t.decompress_s:.3f}, lookahead/decay {t.apply_s:.3f}), forward+"
              f"backward {figures[1]:.3f} s{'' if repeat else ' (warm-up)'}", flush=True)
    assert best is not None
    if profile_to is not None:
        step = 4 + repeats
        with model_work_marked(trainer), profile(activities=[ProfilerActivity.CPU]) as prof:
            trainer.apply_payloads(step, [_restamped(p, step - 2) for p in payloads])
            trainer.train(step, tokens, batch_id=(step, step))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40,
                                          max_name_column_width=60)
        profile_to.write_text(f"DisTrO's own operators (outside {MODEL_WORK}), by self CPU time:\n"
                              f"{distro_self_times(prof.events())}\n"
                              f"Every operator of the step, forward/backward included:\n{table}")
        print(f"profile of step {step} written to {profile_to}", flush=True)
    return best


def distro_self_times(events: Any, rows: int = 25) -> str:
    """Self CPU seconds and calls per operator, leaving out the model's work (MODEL_WORK
    and what runs inside it): a table, largest first."""
    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    for event in events:
        parent, inside = event, False
        while parent is not None and not inside:
            inside = parent.name == MODEL_WORK
            parent = parent.cpu_parent
        if inside:
            continue
        seconds[event.name] = seconds.get(event.name, 0.0) + event.self_cpu_time_total / 1e6
        calls[event.name] = calls.get(event.name, 0) + 1
    total = sum(seconds.values())
    lines = [f"{'operator':<40} {'self s':>9} {'share':>7} {'calls':>6}"]
    for name, spent in sorted(seconds.items(), key=lambda item: -item[1])[:rows]:
        lines.append(f"{name:<40} {spent:9.3f} {spent / total:7.1%} {calls[name]:6d}")
    lines.append(f"{'total':<40} {total:9.3f}")
    return "\n".join(lines)


def _restamped(payload: bytes, step: int) -> bytes:
    """The same result, said to be of `step` (the wire's step field: bytes 6..10)."""
    return payload[:6] + step.to_bytes(4, "little") + payload[10:]


def measure(args: argparse.Namespace) -> dict[str, float | int]:
    figures: dict[str, float | int] = {}
    with tempfile.TemporaryDirectory() as scratch:
        figures.update(ops_growth(Path(scratch)))
        print(f"DisTrO kernels per step: {figures['distro_ops_per_step']} (tiny model), "
              f"{figures['distro_ops_per_step_2x_layers']} (twice the layers): growth "
              f"{figures['distro_ops_growth']}", flush=True)
        if not args.ops_only:
            size = args.size
            model_dir = TINY if size == "tiny" else generated_model(size, Path(scratch) / size)
            vocab = 4096 if size == "tiny" else int(GENERATED[size]["vocab_size"])
            step_s, fwd_bwd_s = step_over_fwd_bwd(
                model_dir, peers=args.peers, batch=args.batch, seq_len=args.seq_len,
                repeats=args.repeats, vocab=vocab, profile_to=args.profile)
            figures[f"distro_step_over_fwd_bwd_{size}"] = round(step_s / fwd_bwd_s, 4)
            figures[f"distro_step_s_{size}"] = round(step_s, 3)
            figures[f"fwd_bwd_s_{size}"] = round(fwd_bwd_s, 3)
            print(f"{size}: DisTrO step {step_s:.3f} s over forward+backward {fwd_bwd_s:.3f} s"
                  f" = {step_s / fwd_bwd_s:.4f} ({args.peers} peers, batch {args.batch} x "
                  f"{args.seq_len}, {torch.get_num_threads()} threads)", flush=True)
    return figures


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops-only", action="store_true", help="only the kernel counts")
    p.add_argument("--size", choices=("tiny", *GENERATED), default="125m")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--peers", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--profile", type=Path, default=None, metavar="TABLE",
                   help="write a torch.profiler table of one more step to TABLE")
    return p


def main(argv: list[str] | None = None) -> None:
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    print(json.dumps(measure(parser().parse_args(argv))))


if __name__ == "__main__":
    main()
