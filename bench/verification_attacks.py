"""The dishonest results bench/verification.py sweeps, and the machine setups an honest
replay differs by (its noise sources).

Post-hoc attacks train honestly and alter what they publish, so their trainer's state is
the honest one; judging them against the honest trainer's shadow is exact:

    sign_flip_<pct>   pct % of the filled slots with their sign flipped
    scale_<x>         every value x (values mode only: 1-bit sends signs, the same bytes)
    partial_copy      half the blocks (seeded) from a peer's result of the step, half its own
    stale             its own result of the previous step, re-sent as this one
    copy_pos<a>       the client at batch position a sends the result of the next position's
                      client (a + 1, the last one the first's): a copier ahead of its
                      original for every a but the last
    random_signs      its indices with random signs; zeros: every slot empty

Lazy trainers train less, so they keep their own (lazy) delta across steps: each is its
own trainer replayed against the honest shadow of the batch it claims:

    lazy_<pct>        trains on the first pct % of each sequence's tokens (the hardest lazy
                      trainer to see: its first tokens have exactly the honest context)
    lazy_microbatch   splits its batch into micro-batches of 1 and runs only the first,
                      scaled as if it had run them all (fewer micro-batches)
    wrong_batch       trains fully, on other rows than its assigned ones
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from client_image.formats.blocks import SparseResult
from client_image.formats.distro_wire import DistroResult
from client_image.formats.replay_settings import ReplaySettings
from client_image.training.objective import causal_lm_loss
from client_image.training.precision import ComputeDType
from client_image.verification.settings import active as active_settings
from client_image.verification.settings import capture

SIGN_FLIP_PCTS = (0.5, 1.0, 2.0, 5.0)
SCALES = (1.01, 1.05, 1.2)
LAZY_PCTS = (50, 75, 90)
GROSS = ("random_signs", "zeros", "stale", "partial_copy", "wrong_batch")
POST_HOC = (tuple(f"sign_flip_{p:g}" for p in SIGN_FLIP_PCTS)
            + tuple(f"scale_{x:g}" for x in SCALES)
            + ("partial_copy", "stale", "random_signs", "zeros"))
LAZY = (*(f"lazy_{p}" for p in LAZY_PCTS), "lazy_microbatch", "wrong_batch")
WRONG_BATCH_OFFSET = 9000  # rows away from any assigned batch of the bench


@dataclass(frozen=True)
class Setup:
    """How one machine computes a step: its compute dtype, torch threads, micro-batch size,
    attention kernel (CPU torch has math and flash SDPA; `efficient` is CUDA-only) and
    whether oneDNN takes its matmuls (off: as on a CPU without oneDNN's bf16 kernels)."""

    compute: ComputeDType
    threads: int
    micro: int
    kernel: str
    onednn: bool = True

    def declared(self) -> ReplaySettings:
        """What a trainer in this setup declares in its results (formats/replay_settings)."""
        return capture(self.compute, self.micro, "cpu", attention=self.kernel,
                       threads=self.threads, onednn=self.onednn)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with active_settings(self.declared()):
            yield


def trainer_setup(compute: ComputeDType, per_peer: int) -> Setup:
    return Setup(compute, threads=1, micro=per_peer, kernel="math")


def noise_sources(compute: ComputeDType, per_peer: int) -> dict[str, Setup]:
    """The verifier machines an honest trainer (trainer_setup) is replayed on, by source.
    `dtype_mismatch` (an fp32 replay of a bf16 trainer) is measured, never counted as
    honest noise: a verifier must replay in the trainer's declared dtype. `declared` replays
    in everything the trainer declares (formats/replay_settings.py); `other_cpu` too but
    with oneDNN off (a CPU without its bf16 kernels, which cannot reproduce a declaration
    of oneDNN: the loose limits judge it)."""
    own = trainer_setup(compute, per_peer)
    sources = {
        "declared": own,
        "other_cpu": Setup(compute, own.threads, own.micro, own.kernel, onednn=False),
        "threads": Setup(compute, threads=2, micro=per_peer, kernel="math"),
        "microbatch": Setup(compute, threads=1, micro=1, kernel="math"),
    }
    if compute == "bf16":
        sources["sdpa_kernel"] = Setup(compute, threads=1, micro=per_peer, kernel="flash")
        sources["mixed"] = Setup(compute, threads=2, micro=1, kernel="flash")
        sources["dtype_mismatch"] = Setup("fp32", threads=1, micro=per_peer, kernel="math")
    else:
        sources["mixed"] = Setup(compute, threads=2, micro=1, kernel="flash")
    return sources


REFERENCE_SOURCE = "mixed"  # attacks are judged against the most different honest machine
DECLARED_SOURCE = "declared"  # ... and against a replay in the trainer's declared settings
UNDECLARED_SOURCES = ("threads", "microbatch", "sdpa_kernel", "mixed", "other_cpu")


def _flip(t: SparseResult, frac: float, rng: torch.Generator) -> SparseResult:
    flip = torch.rand(t.val.shape, generator=rng) < frac
    return SparseResult(t.idx, torch.where(flip, -t.val, t.val))


def post_hoc(name: str, honest: DistroResult, previous: DistroResult | None,
             peer: DistroResult, rng: torch.Generator) -> list[SparseResult] | None:
    """The attacker's tensors, or None where the attack has nothing to send (stale with
    no previous result)."""
    tensors = honest.tensors
    if name.startswith("sign_flip_"):
        frac = float(name.removeprefix("sign_flip_")) / 100
        return [_flip(t, frac, rng) for t in tensors]
    if name.startswith("scale_"):
        factor = float(name.removeprefix("scale_"))
        return [SparseResult(t.idx, (t.val.float() * factor).to(t.val.dtype)) for t in tensors]
    if name == "partial_copy":
        out = []
        for own, other in zip(tensors, peer.tensors, strict=True):
            rows = (torch.rand(own.idx.shape[0], generator=rng) < 0.5).unsqueeze(1)
            out.append(SparseResult(torch.where(rows, other.idx, own.idx),
                                    torch.where(rows, other.val, own.val)))
        return out
    if name == "stale":
        return None if previous is None else list(previous.tensors)
    if name == "random_signs":
        return [SparseResult(t.idx, t.val.abs() * (torch.randint(0, 2, t.val.shape, generator=rng)
                                                   * 2 - 1).to(t.val.dtype)) for t in tensors]
    if name == "zeros":
        return [SparseResult(torch.zeros_like(t.idx), torch.zeros_like(t.val)) for t in tensors]
    raise ValueError(f"unknown attack {name!r}")


def lazy_batch(name: str, batch: torch.Tensor) -> torch.Tensor:
    """The tokens a lazy trainer trains on instead of its assigned `batch`."""
    if name.startswith("lazy_") and name != "lazy_microbatch":
        keep = round(int(name.removeprefix("lazy_")) / 100 * batch.shape[-1])
        return batch[..., :keep].contiguous()
    return batch


def first_micro_batch_only(model: torch.nn.Module, batch: torch.Tensor, micro_batch_size: int,
                           compute: ComputeDType) -> float:
    """lazy_microbatch's objective: the first micro-batch's gradient, divided by the count
    of micro-batches it claims to have run."""
    micro_batches = torch.split(batch, micro_batch_size)
    return causal_lm_loss(model, micro_batches[0], micro_batch_size, compute,
                          weight=1.0 / len(micro_batches))
