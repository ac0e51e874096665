"""The dense and uncompressed baselines bench/optimizers.py measures our optimizers against.

DiLoCo (Douillard et al. 2023, arXiv 2311.08105), SparseLoCo's dense counterpart: every
worker takes `inner_steps` AdamW steps from the shared weights on its share of the round's
samples (the same cut as SparseLoCo's, the same inner rate schedule, the AdamW state kept
per worker across rounds); the pseudo-gradients Delta_p = theta - theta_p are averaged
densely in fp32 and the outer step is

    plain averaging (outer_lr 1, momentum 0):  theta -= mean(Delta)
    Nesterov SGD (torch.optim.SGD, nesterov):  v = mu v + mean(Delta);
                                               theta -= outer_lr (mean(Delta) + mu v)

DeMo (Peng, Quesnelle, Kingma 2024, arXiv 2411.19870), DisTrO's predecessor, as the
paper's Algorithm 1 and its reference code: per worker a decoupled momentum
m = decay m + lr g; m is cut into DCT blocks (chunk 64), the top-k coefficients of each
block are kept, their values sent (bf16) with their indices, and what was sent is taken
out of m; the weights move by theta -= lr sign(IDCT(mean of the workers' coefficients))
(each coefficient averaged over the workers that sent it).

Both run as the papers do: synchronously, a round's average applied before the next round
trains, where Psyche's DisTrO and SparseLoCo apply a result two rounds later. Bytes per
worker and round: DiLoCo 4 per parameter (fp32); DeMo k (u16 index + bf16 value) per block.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from client_image.training.distro import (
    dct_blocks,
    from_blocks,
    idct_blocks,
    plan_parameter,
    scatter_mean,
    to_blocks,
    topk_blocks,
)
from client_image.training.lr import scheduled_lr
from client_image.training.model import load_causal_lm
from client_image.training.objective import causal_lm_loss
from client_image.training.simulate import peer_batch_ids
from client_image.training.trainer import clip_gradients, trainable_parameters
from coordinator.config import LRSchedule, SeededShuffle
from psyche_common.token_files.local import LocalDataProvider


@dataclass(frozen=True)
class RunShape:
    """What every method of one comparison shares: model, tokens and their order."""

    model: Path
    data: Path
    steps: int
    total_batch: int
    micro_batch: int
    peers: int
    seq_len: int
    seed: int
    max_epochs: int = 1
    device: str = "cpu"


@dataclass(frozen=True)
class DiLoCoSettings:
    inner_steps: int
    inner_lr: float
    outer_lr: float = 1.0
    outer_momentum: float = 0.0  # 0: plain averaging (with outer_lr 1); > 0: Nesterov
    inner_betas: tuple[float, float] = (0.9, 0.95)
    clip_grad_norm: float | None = 1.0


@dataclass(frozen=True)
class DemoSettings:
    topk: int = 32  # DeMo's default: 32 of every 64 x 64 block
    chunk: int = 64
    decay: float = 0.999  # DeMo's compression_decay
    clip_grad_norm: float | None = 1.0
    value_bytes: int = 2  # bf16, as the reference code sends them
    index_bytes: int = 2  # u16 (a 64 x 64 block has 4096 positions)


class Samples:
    """The training samples in the order bench/optimizers.py's Simulation reads them
    (the same seeded shuffle, read over again up to max_epochs)."""

    def __init__(self, shape: RunShape, round_batch: int, rounds: int) -> None:
        self.data = LocalDataProvider(shape.data, shape.seq_len,
                                      shuffle=SeededShuffle(seed=shape.seed.to_bytes(32, "little")))
        needed = rounds * round_batch
        if needed > self.data.num_sequences * shape.max_epochs:
            raise ValueError(f"{rounds} rounds x {round_batch} samples need {needed} sequences, "
                             f"the data set has {self.data.num_sequences} "
                             f"(x max_epochs {shape.max_epochs})")

    def get(self, start: int, end: int) -> torch.Tensor:
        n = self.data.num_sequences
        first, last = start % n, end % n
        if end - start < n and first <= last:
            return self.data.get_samples(first, last)
        return torch.cat([self.data.get_samples(i % n, i % n) for i in range(start, end + 1)])


def inner_parts(batch: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """A worker's round batch cut as SparseLoCoTrainer.inner_batches cuts it."""
    parts = min(parts, len(batch))
    base, extra = divmod(len(batch), parts)
    out, start = [], 0
    for part in range(parts):
        size = base + (1 if part < extra else 0)
        out.append(batch[start : start + size])
        start += size
    return out


class DiLoCo:
    """`peers` workers, one model copy and one inner AdamW each, one round per
    `inner_steps` steps; `schedule` counts inner steps (peak base_lr, scaled to inner_lr)."""

    def __init__(self, shape: RunShape, settings: DiLoCoSettings, schedule: LRSchedule) -> None:
        if shape.steps % settings.inner_steps:
            raise ValueError(f"steps {shape.steps} must be a multiple of inner_steps "
                             f"{settings.inner_steps}")
        torch.manual_seed(shape.seed)
        self.shape, self.settings, self.schedule = shape, settings, schedule
        self.rounds = shape.steps // settings.inner_steps
        self.round_batch = shape.total_batch * settings.inner_steps
        self.samples = Samples(shape, self.round_batch, self.rounds)
        self.models = [load_causal_lm(shape.model, dtype="fp32", device=shape.device)
                       for _ in range(shape.peers)]
        self.model = self.models[0]
        self.params: list[list[torch.Tensor]] = [
            [p for _, p in trainable_parameters(m)] for m in self.models]
        self.theta = [p.detach().clone() for p in self.params[0]]
        self.inner = [torch.optim.AdamW(ps, lr=0.0, betas=settings.inner_betas, weight_decay=0.0,
                                        eps=1e-8) for ps in self.params]
        self.momentum = [torch.zeros_like(t) for t in self.theta]
        self.param_count = sum(t.numel() for t in self.theta)

    @property
    def payload_bytes_per_round(self) -> float:
        return 4.0 * self.param_count

    def run(self) -> Iterator[int]:
        """Trains round by round, yielding each round's number after its outer step."""
        for step in range(self.rounds):
            self.round(step)
            yield step

    def round(self, step: int) -> None:
        cfg, h = self.settings, self.settings.inner_steps
        rates = [cfg.inner_lr / self.schedule.base_lr * scheduled_lr(self.schedule, step * h + j)
                 for j in range(h)]
        mean_delta = [torch.zeros_like(t) for t in self.theta]
        for model, params, inner, batch_id in zip(self.models, self.params, self.inner,
                                                  peer_batch_ids(step, self.round_batch,
                                                                 self.shape.peers), strict=False):
            with torch.no_grad():
                torch._foreach_copy_(params, self.theta)
            batch = self.samples.get(*batch_id).to(self.shape.device)
            for lr, part in zip(rates, inner_parts(batch, h), strict=False):
                for group in inner.param_groups:
                    group["lr"] = lr
                inner.zero_grad(set_to_none=True)
                causal_lm_loss(model, part, self.shape.micro_batch, "fp32")
                clip_gradients(params, cfg.clip_grad_norm)
                if lr:
                    inner.step()
            inner.zero_grad(set_to_none=True)
            with torch.no_grad():  # mean of Delta_p = theta - theta_p, in fp32
                torch._foreach_add_(mean_delta, torch._foreach_sub(self.theta, params),
                                    alpha=1.0 / self.shape.peers)
        with torch.no_grad():
            if cfg.outer_momentum:
                torch._foreach_mul_(self.momentum, cfg.outer_momentum)
                torch._foreach_add_(self.momentum, mean_delta)
                torch._foreach_add_(mean_delta, self.momentum, alpha=cfg.outer_momentum)
            torch._foreach_add_(self.theta, mean_delta, alpha=-cfg.outer_lr)
            torch._foreach_copy_(self.params[0], self.theta)  # what .model evaluates


class DeMo:
    """`peers` workers on one shared model (synchronous: their weights are always equal),
    a decoupled momentum each; one round per step."""

    def __init__(self, shape: RunShape, settings: DemoSettings, schedule: LRSchedule) -> None:
        torch.manual_seed(shape.seed)
        self.shape, self.settings, self.schedule = shape, settings, schedule
        self.rounds = shape.steps
        self.samples = Samples(shape, shape.total_batch, self.rounds)
        self.model = load_causal_lm(shape.model, dtype="fp32", device=shape.device)
        named = trainable_parameters(self.model)
        self.params = [p for _, p in named]
        self.plans = [plan_parameter(name, p.shape, settings.chunk, settings.topk)
                      for name, p in named]
        self.momenta = [[torch.zeros_like(p) for p in self.params] for _ in range(shape.peers)]
        slot = settings.value_bytes + settings.index_bytes
        self.payload_bytes_per_round = float(
            sum(plan.n_blocks * plan.topk * slot for plan in self.plans))

    def run(self) -> Iterator[int]:
        for step in range(self.rounds):
            self.round(step)
            yield step

    def round(self, step: int) -> None:
        cfg = self.settings
        lr = scheduled_lr(self.schedule, step)
        sent: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        for momenta, batch_id in zip(self.momenta, peer_batch_ids(
                step, self.shape.total_batch, self.shape.peers), strict=False):
            self.model.zero_grad(set_to_none=True)
            batch = self.samples.get(*batch_id).to(self.shape.device)
            causal_lm_loss(self.model, batch, self.shape.micro_batch, "fp32")
            clip_gradients(self.params, cfg.clip_grad_norm)
            worker = []
            with torch.no_grad():
                for param, m, plan in zip(self.params, momenta, self.plans, strict=True):
                    assert param.grad is not None
                    m.mul_(cfg.decay).add_(param.grad, alpha=lr)
                    idx, val = topk_blocks(dct_blocks(to_blocks(m, plan)), plan.topk)
                    val = val.to(torch.bfloat16).to(m.dtype)  # what the wire carries
                    coefficients = torch.zeros(plan.n_blocks, plan.block_numel, dtype=m.dtype,
                                               device=m.device)
                    coefficients.scatter_add_(1, idx, val)  # an empty slot adds 0
                    m.sub_(from_blocks(idct_blocks(
                        coefficients.view(plan.n_blocks, *plan.block_shape)), plan))
                    worker.append((idx, val))
            sent.append(worker)
        self.model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for i, (param, plan) in enumerate(zip(self.params, self.plans, strict=True)):
                mean = scatter_mean([w[i][0] for w in sent], [w[i][1] for w in sent],
                                    plan.block_numel)
                update = from_blocks(idct_blocks(mean.view(plan.n_blocks, *plan.block_shape)),
                                     plan)
                param.sub_(torch.sign(update), alpha=lr)
