"""Numeric precision of a client's training: what runs in bf16 and what stays fp32, and why.

    weights (master)        fp32, always. Every client applies the same signed update
                            `theta -= lr * sign(mean of results)` to the same fp32 values,
                            so the run's model is bit-identical on every client whatever
                            each one computes in: a CPU client in fp32 and a GPU client in
                            bf16 can share one run. (torchtitan's FSDP2 mixed precision
                            keeps fp32 sharded parameters the same way.) Checkpoints and
                            shared models are bf16 (Psyche's cooldown rounding).
    compute                 `--dtype bf16`: forward and backward under torch.autocast
                            (matmuls and attention in bf16, reductions, norms and the loss
                            in fp32 as autocast chooses); `fp32`: plain fp32. `auto`: bf16
                            on CUDA, fp32 elsewhere. TF32 matmuls are allowed on CUDA.
    gradients               fp32 (the parameters' dtype): micro-batches accumulate in fp32.
    DisTrO buffers          momentum / error feedback `delta` in fp32: it sums many small
                            `lr * grad` terms decayed by 0.999 per step, and bf16's 8-bit
                            mantissa rounds an increment a thousandth of the buffer away
                            (tests/training/test_precision.py). On the tiny model the loss
                            shows no effect (bench/train_step.py: bf16 / fp32 buffers 0.9995
                            at 50 steps; 1.0001 at decay 0.999 over 100): top-k and 1-bit
                            signs survive the rounding there. fp32 costs 4 bytes per
                            parameter instead of 2, and keeps the buffer exact.
    activation checkpointing  `--activation-checkpointing`: recompute each layer's
                            activations in backward (transformers' gradient checkpointing),
                            trading about a third more compute for activation memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch

ComputeDType = Literal["bf16", "fp32"]
DTYPE_CHOICES = ("auto", "bf16", "fp32")


class PrecisionError(ValueError):
    """A precision setting this host or client cannot use."""


def resolve_compute_dtype(name: str, device: str | torch.device) -> ComputeDType:
    """`auto` -> bf16 on CUDA, fp32 elsewhere; bf16 and fp32 as given."""
    kind = torch.device(device).type
    if name == "auto":
        return "bf16" if kind == "cuda" else "fp32"
    if name not in ("bf16", "fp32"):
        raise PrecisionError(f"unknown dtype {name!r}; use auto, bf16 or fp32")
    return "bf16" if name == "bf16" else "fp32"


@contextlib.contextmanager
def compute_context(compute: ComputeDType, device: str | torch.device) -> Iterator[None]:
    """The autocast region forward and backward run in (nothing for fp32)."""
    if compute == "fp32":
        yield
        return
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
        yield


def configure_backends(device: str | torch.device) -> None:
    """TF32 tensor-core matmuls on CUDA (fp32 matmuls at near-bf16 speed); no-op on CPU."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if not callable(enable):
        raise PrecisionError(f"{type(model).__name__} has no activation checkpointing")
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})
