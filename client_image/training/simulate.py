"""One process simulating P peers of a run: what `psyche-train` and bench/distro.py drive.

DisTrO: every peer holds its own model copy and DisTrO state, trains its share of each
step's batch, publishes a payload in the wire format; every peer decodes all payloads of
step s-2 and applies them before training step s, exactly as the network would deliver
them. After the last step two apply-only rounds flush the pipeline (as at an epoch's end).
AdamW: one model on the whole batch (the dense all-reduce baseline).
SparseLoCo: as DisTrO, one round per `inner_steps` steps: a round's batch is those steps'
samples, so every optimizer sees the same samples for the same `steps` (rounds =
steps / inner_steps; the schedule counts inner steps, so it is AdamW's).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from client_image.training.defaults import ADAMW_LR, DISTRO_LR, DISTRO_PSYCHE, SPARSELOCO
from client_image.training.model import load_causal_lm
from client_image.training.precision import ComputeDType
from client_image.training.sparseloco_trainer import SparseLoCoTrainer
from client_image.training.trainer import AdamWTrainer, DistroTrainer, Timings
from coordinator.config import (
    AdamWOptimizer,
    ConstantLR,
    CosineLR,
    DistroOptimizer,
    LRSchedule,
    SeededShuffle,
    SparseLoCoOptimizer,
)
from psyche_common.token_files.local import LocalDataProvider


@dataclass
class SimulationConfig:
    model: Path
    data: Path
    steps: int
    total_batch: int = 16
    micro_batch: int = 4
    peers: int = 4
    optimizer: Literal["distro", "adamw", "sparseloco"] = "distro"
    seq_len: int = 128
    seed: int = 0
    device: str = "cpu"
    dtype: Literal["bf16", "fp32"] = "fp32"  # the weights'
    compute: ComputeDType = "fp32"  # forward/backward (precision.py)
    buffer_dtype: Literal["bf16", "fp32"] = "fp32"  # DisTrO's delta
    distro: DistroOptimizer = field(default_factory=lambda: DISTRO_PSYCHE)
    adamw: AdamWOptimizer = field(
        default_factory=lambda: AdamWOptimizer(
            betas=(0.9, 0.95), weight_decay=0.0, eps=1e-8, clip_grad_norm=1.0
        )
    )
    sparseloco: SparseLoCoOptimizer = field(default_factory=lambda: SPARSELOCO)
    lr_schedule: LRSchedule | None = None  # default: cosine from default_lr
    max_epochs: int = 1  # passes over the data allowed (each in the same shuffled order)

    @property
    def rounds(self) -> int:
        """Optimizer rounds: steps, or steps / inner_steps for SparseLoCo."""
        if self.optimizer == "sparseloco":
            return self.steps // self.sparseloco.inner_steps
        return self.steps

    @property
    def round_batch(self) -> int:
        """Samples of one round over all peers."""
        if self.optimizer == "sparseloco":
            return self.total_batch * self.sparseloco.inner_steps
        return self.total_batch


def default_schedule(optimizer: str, steps: int, base_lr: float | None = None) -> LRSchedule:
    """Warm-up over 5% of the steps then cosine to a tenth (the tuned rates of bench/distro.py)."""
    lr = base_lr if base_lr is not None else (DEFAULT_DISTRO_LR if optimizer == "distro" else DEFAULT_ADAMW_LR)
    warmup = max(1, steps // 20)
    if steps <= warmup + 1:
        return ConstantLR(base_lr=lr, warmup_init_lr=0.0, warmup_steps=warmup)
    return CosineLR(
        base_lr=lr, warmup_init_lr=0.0, final_lr=lr / 10, warmup_steps=warmup, total_steps=steps
    )


DEFAULT_DISTRO_LR = DISTRO_LR
DEFAULT_ADAMW_LR = ADAMW_LR


@dataclass
class StepReport:
    step: int
    loss: float  # mean over the peers' batches
    payload_bytes_per_peer: float  # 0 for AdamW
    dense_fp32_bytes: int


def peer_batch_ids(step: int, total_batch: int, peers: int) -> list[tuple[int, int]]:
    """Contiguous inclusive sample ranges of one step, the first total % peers one longer."""
    base, extra = divmod(total_batch, peers)
    ranges, start = [], step * total_batch
    for peer in range(peers):
        size = base + (1 if peer < extra else 0)
        if size:
            ranges.append((start, start + size - 1))
        start += size
    return ranges


class Simulation:
    def __init__(self, config: SimulationConfig) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        seed_bytes = config.seed.to_bytes(32, "little")
        self.data = LocalDataProvider(config.data, config.seq_len, shuffle=SeededShuffle(seed=seed_bytes))
        needed = config.rounds * config.round_batch
        if needed > self.data.num_sequences * config.max_epochs:
            raise ValueError(
                f"{config.rounds} rounds x {config.round_batch} samples need {needed} sequences, "
                f"the data set has {self.data.num_sequences} (x max_epochs {config.max_epochs})"
            )
        schedule = config.lr_schedule or default_schedule(config.optimizer, config.steps)
        n_models = config.peers if config.optimizer != "adamw" else 1
        models = [
            load_causal_lm(config.model, dtype=config.dtype, device=config.device)
            for _ in range(n_models)
        ]
        self.params = sum(p.numel() for p in models[0].parameters() if p.requires_grad)
        buffer_dtype = torch.bfloat16 if config.buffer_dtype == "bf16" else torch.float32
        self.distro: list[DistroTrainer | SparseLoCoTrainer] = []
        if config.optimizer == "distro":
            self.distro = [
                DistroTrainer(m, config.distro, schedule, micro_batch_size=config.micro_batch,
                              compute=config.compute, buffer_dtype=buffer_dtype)
                for m in models]
        elif config.optimizer == "sparseloco":
            self.distro = [
                SparseLoCoTrainer(m, config.sparseloco, schedule,
                                  micro_batch_size=config.micro_batch, compute=config.compute)
                for m in models]
        self.adamw = (
            AdamWTrainer(models[0], config.adamw, schedule, micro_batch_size=config.micro_batch,
                         compute=config.compute)
            if config.optimizer == "adamw" else None
        )
        self.model = models[0]
        self._payloads: dict[int, list[bytes]] = {}

    @property
    def timings(self) -> Timings:
        trainers: list[DistroTrainer | SparseLoCoTrainer | AdamWTrainer] = list(self.distro)
        if self.adamw is not None:
            trainers.append(self.adamw)
        total = Timings()
        for t in trainers:
            for name in ("forward_backward_s", "compress_s", "decompress_s", "apply_s"):
                setattr(total, name, getattr(total, name) + getattr(t.timings, name))
        return total

    def run(self) -> Iterator[StepReport]:
        for step in range(self.config.rounds):
            yield self.step(step)
        if self.distro:  # flush: the last two steps' results are applied without training
            for step in range(self.config.rounds, self.config.rounds + 2):
                self._apply(step)

    def step(self, step: int) -> StepReport:
        cfg = self.config
        ranges = peer_batch_ids(step, cfg.round_batch, cfg.peers)
        dense = self.params * 4
        if self.adamw is not None:
            batch = self._samples(step * cfg.total_batch, (step + 1) * cfg.total_batch - 1)
            out = self.adamw.train(step, batch.to(cfg.device))
            return StepReport(step, out.loss, 0.0, dense)
        self._apply(step)
        losses, payloads = [], []
        for trainer, batch_id in zip(self.distro, ranges, strict=False):
            batch = self._samples(*batch_id).to(cfg.device)
            out = trainer.train(step, batch, batch_id=batch_id)
            assert out.payload is not None
            losses.append(out.loss)
            payloads.append(out.payload)
        self._payloads[step] = payloads
        mean_bytes = sum(len(p) for p in payloads) / len(payloads)
        return StepReport(step, sum(losses) / len(losses), mean_bytes, dense)

    def _samples(self, start: int, end: int) -> torch.Tensor:
        """Samples start..end (inclusive) of the data read over and over (max_epochs)."""
        n = self.data.num_sequences
        first, last = start % n, end % n
        if end - start < n and first <= last:
            return self.data.get_samples(first, last)
        return torch.cat([self.data.get_samples(i % n, i % n) for i in range(start, end + 1)])

    def _apply(self, step: int) -> None:
        payloads = self._payloads.pop(step - 2, [])
        if not payloads:  # heights 0 and 1: nothing has been published yet
            return
        for trainer in self.distro:
            trainer.apply(step, [trainer.decode(p) for p in payloads])


@torch.no_grad()
def validation_loss(
    model: torch.nn.Module, data: Path, seq_len: int, samples: int = 64, micro_batch: int = 16
) -> float:
    """Mean next-token cross-entropy over the first `samples` unshuffled validation samples."""
    provider = LocalDataProvider(data, seq_len)
    count = min(samples, provider.num_sequences)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = 0.0
    for start in range(0, count, micro_batch):
        end = min(start + micro_batch, count) - 1
        batch = provider.get_samples(start, end).to(device)
        total += float(model(input_ids=batch, labels=batch).loss) * (end - start + 1)
    model.train(was_training)
    loss = total / count
    if not math.isfinite(loss):
        raise FloatingPointError(f"validation loss is {loss}")
    return loss
