"""DisTrO on a model split over a D x T device mesh (training/parallel.py).

The same per-step pipeline as DistroTrainer (trainer.py), with one difference in where
things live:

    weights, gradients, delta    sharded like each parameter (DTensors under FSDP2 / TP;
                                 plain tensors for what stays replicated)
    compress                     delta_full = all-gather(delta); the result is computed on
                                 the full tensor by every rank alike (parallelism.md)
    apply, error feedback        decode full, keep this rank's shard (shard_like)

Every update of the weights is elementwise (sign step, lookahead and its exact undo,
weight decay), and the decoded aggregate is the same bytes on every client: clients with
different layouts hold bit-identical weights after each apply, as long as they started
from the same weights. Their own results differ only by the numerics of the gradient
(the D ranks' reduction order), within the tolerance the tests state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor

from client_image.training.distro import (
    BlockLayout,
    BlockPlan,
    compress_parameter,
    decompress_parameter,
)
from client_image.training.objective import causal_lm_loss
from client_image.training.parallel import dp_slice
from client_image.training.precision import ComputeDType
from client_image.training.trainer import (
    DistroTrainer,
    Timings,
    TrainStepOutput,
    _PendingOwnResult,
    distro_plans,
    trainable_parameters,
)
from client_image.training.wire import encode_result
from coordinator.config import DistroOptimizer, LRSchedule


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (an all-gather for a sharded DTensor)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's piece of `full` (the same on every rank), placed as `like` is. No
    communication: each rank cuts its own shard (src_data_rank=None)."""
    if isinstance(like, DTensor):
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    return full


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float | None) -> float:
    """torch.nn.utils.clip_grad_norm_'s rule (total = ||(||g_i||)_i||, grads *= max_norm /
    (total + 1e-6) when that is below 1) over sharded and replicated gradients alike:
    each sharded norm is reduced over its mesh, a replicated one is counted once."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norms = [full_tensor(torch.linalg.vector_norm(g)) for g in grads]
    total = torch.linalg.vector_norm(torch.stack(norms))
    if max_norm is not None:
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(coefficient)
    return float(total)


class ShardedDistroTrainer(DistroTrainer):
    """DistroTrainer for a model parallelized over `mesh` (every rank runs every call with
    the same arguments; rank_group.py sees to it). Results are in the wire format of
    DistroTrainer, bit for bit what any layout's client decodes."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: DistroOptimizer,
        lr_schedule: LRSchedule,
        *,
        mesh: DeviceMesh,
        micro_batch_size: int,
        cold_start_warmup_steps: int = 0,
        start_step: int = 0,
        compute: ComputeDType = "fp32",
        buffer_dtype: torch.dtype = torch.float32,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.model = model
        self.mesh = mesh
        self.compute = compute
        self.config = optimizer
        self.lr_schedule = lr_schedule
        self.micro_batch_size = micro_batch_size
        self.cold_start_warmup_steps = cold_start_warmup_steps
        self.start_step = start_step
        named = trainable_parameters(model)
        self.names = [name for name, _ in named]
        self.params: list[torch.Tensor] = [p for _, p in named]
        # DTensor shapes are the full parameters' shapes: the same plans as one device.
        self.plans: list[BlockPlan] = distro_plans(model, named, optimizer)
        self.layout = BlockLayout(self.plans)
        # One delta per parameter, sharded like it (zeros_like keeps the placements).
        self.sharded_delta = [torch.zeros_like(p, dtype=buffer_dtype) for p in self.params]
        self.device = self.params[0].to_local().device if isinstance(
            self.params[0], DTensor) else self.params[0].device
        self.trainer_nonce = 0
        self.timings = Timings()
        self._pending: _PendingOwnResult | None = None

    def delta_tensors(self) -> list[torch.Tensor]:
        return [full_tensor(d).clone() for d in self.sharded_delta]

    def reset_delta(self) -> None:
        """As DistroTrainer.reset_delta: the epoch starts from a zero delta."""
        with torch.no_grad():
            for delta in self.sharded_delta:
                delta.zero_()
        self._pending = None

    # apply: DistroTrainer's, one parameter at a time (the full-size scratch is the
    # largest parameter's), each rank keeping the shard of the update it holds.
    def _apply_device(self, param: torch.Tensor) -> torch.device | str:
        return self.device

    def _add_update(self, param: torch.Tensor, update: torch.Tensor, lr: float) -> None:
        param.add_(shard_like(update.sign_(), param), alpha=-lr)

    def train(
        self,
        step: int,
        batch: torch.Tensor,
        *,
        batch_id: tuple[int, int] = (0, 0),
        cold_start: bool = False,
        decay_weights: bool = True,
    ) -> TrainStepOutput:
        """DistroTrainer.train on this rank's share of `batch` (the whole assigned batch,
        the same on every rank); every rank returns the same payload."""
        lr_now = self.learning_rate(step)
        lr_prev = self.learning_rate(max(step - 1, 0))
        started = time.perf_counter()
        for param in self.params:
            param.grad = None
        with torch.no_grad():
            if cold_start:
                for delta in self.sharded_delta:
                    delta.zero_()
                self._pending = None
            saved = [p.detach().clone() for p in self.params] if lr_prev else []
            if lr_prev:  # lookahead (trainer.py): undone exactly by restoring `saved`
                for param, delta in zip(self.params, self.sharded_delta, strict=True):
                    param.add_(delta.sign(), alpha=-lr_prev)
        self.timings.apply_s += time.perf_counter() - started

        started = time.perf_counter()
        share, weight = dp_slice(batch, self.mesh)
        loss = causal_lm_loss(self.model, share.to(self.device), self.micro_batch_size,
                              self.compute, weight)
        loss = self._mean_over_dp(loss * weight)
        grad_norm = clip_grad_norm(self.params, self.config.clip_grad_norm)
        self.timings.forward_backward_s += time.perf_counter() - started

        with torch.no_grad():
            started = time.perf_counter()
            for param, copy in zip(self.params, saved, strict=False):
                param.copy_(copy)
            del saved
            if self.config.weight_decay and decay_weights:
                for param in self.params:
                    param.mul_(1 - lr_now * self.config.weight_decay)
            applied_at = time.perf_counter()
            self.timings.apply_s += applied_at - started
            if self._pending is not None:  # error feedback, one parameter at a time
                for delta, plan, sent in zip(self.sharded_delta, self.plans,
                                             self._pending.tensors, strict=True):
                    full = decompress_parameter([sent], plan, delta.dtype, self.device)
                    delta.sub_(shard_like(full, delta))
            decompressed_at = time.perf_counter()
            self.timings.decompress_s += decompressed_at - applied_at
            for param, delta in zip(self.params, self.sharded_delta, strict=True):
                delta.mul_(self.config.compression_decay)
                if param.grad is not None:
                    delta.add_(param.grad, alpha=lr_now)
            # The full delta, gathered and compressed one parameter at a time by every rank.
            sparse = [compress_parameter(full_tensor(delta), plan)
                      for delta, plan in zip(self.sharded_delta, self.plans, strict=True)]
            payload = encode_result(
                sparse, self.plans, step=step, trainer_nonce=self.trainer_nonce,
                batch_start=batch_id[0], batch_end=batch_id[1], one_bit=self.config.quantize_1bit,
            )
            self.timings.compress_s += time.perf_counter() - decompressed_at
        self._pending = _PendingOwnResult(step, sparse)
        self.trainer_nonce += 1
        return TrainStepOutput(step, loss, payload, grad_norm, ranks=self.mesh.size(),
                               learning_rate=lr_now)

    def _mean_over_dp(self, weighted_loss: float) -> float:
        """The mean loss over the whole batch: sum over the D ranks of share-weighted losses / D."""
        dp = self.mesh["dp"]
        if dp.size() == 1:
            return weighted_loss
        total = torch.tensor([weighted_loss], dtype=torch.float64)
        dist.all_reduce(total, group=dp.get_group())
        return float(total) / dp.size()
