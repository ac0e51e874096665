"""DisTrO on a model split over a D x T device mesh (training/parallel.py).

The same per-step pipeline as DistroTrainer (trainer.py), the same DisTrO step
(distro_step.py) over another view of the parameters (ShardedParameters):

    weights, gradients, delta    sharded like each parameter (DTensors under FSDP2 / TP;
                                 plain tensors for what stays replicated)
    compress                     delta_full = all-gather(delta), a chunk of parameters at
                                 a time; the result is computed on the full tensors by
                                 every rank alike (parallelism.md)
    apply, error feedback        decode full (a chunk at a time), keep this rank's shard
                                 (shard_like)

Every update of the weights is elementwise (sign step, lookahead and its exact undo,
weight decay), and the decoded aggregate is the same bytes on every client: clients with
different layouts hold bit-identical weights after each apply, as long as they started
from the same weights. Their own results differ only by the numerics of the gradient
(the D ranks' reduction order), within the tolerance the tests state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor

from client_image.training.distro_step import StepChunk, unstack_blocks
from client_image.training.objective import causal_lm_loss
from client_image.training.parallel import dp_slice
from client_image.training.precision import ComputeDType
from client_image.training.trainer import DistroTrainer
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


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a tensor (its storage: in-place work on it is on the tensor)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class ShardedParameters:
    """distro_step.ParameterView of parameters sharded over a mesh (DTensors under FSDP2
    or TP, plain tensors for what stays replicated): compress sees the whole tensors
    (all-gathered), elementwise work runs on each rank's shard, and a decoded update is
    cut by every rank alike (shard_like)."""

    def full(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [full_tensor(t) for t in tensors]

    def local(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [local_tensor(t) for t in tensors]

    def add_blocks(self, targets: Sequence[torch.Tensor], stacks: Sequence[torch.Tensor],
                   chunk: StepChunk, alpha: float) -> None:
        whole = unstack_blocks(stacks, chunk)
        parts = [local_tensor(shard_like(w, t)) for w, t in zip(whole, targets, strict=True)]
        torch._foreach_add_(self.local(targets), parts, alpha=alpha)


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
    the same arguments; rank_group.py sees to it): the same DisTrO step over the
    ShardedParameters view. Results are in the wire format of DistroTrainer, bit for bit
    what any layout's client decodes."""

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
        first = next(p for p in model.parameters() if p.requires_grad)
        self.mesh = mesh
        self.device = local_tensor(first).device
        super().__init__(model, optimizer, lr_schedule, micro_batch_size=micro_batch_size,
                         cold_start_warmup_steps=cold_start_warmup_steps,
                         start_step=start_step, compute=compute, buffer_dtype=buffer_dtype,
                         view=ShardedParameters(), device=self.device)

    def _forward_backward(self, batch: torch.Tensor) -> tuple[float, float]:
        """This rank's share of `batch` (the whole assigned batch, the same on every rank);
        the loss is the whole batch's mean, the gradient norm the whole model's."""
        share, weight = dp_slice(batch, self.mesh)
        loss = causal_lm_loss(self.model, share.to(self.device), self.micro_batch_size,
                              self.compute, weight)
        loss = self._mean_over_dp(loss * weight)
        return loss, clip_grad_norm(self.params, self.config.clip_grad_norm)

    def _ranks(self) -> int:
        return self.mesh.size()

    def _mean_over_dp(self, weighted_loss: float) -> float:
        """The mean loss over the whole batch: sum over the D ranks of share-weighted losses / D."""
        dp = self.mesh["dp"]
        if dp.size() == 1:
            return weighted_loss
        total = torch.tensor([weighted_loss], dtype=torch.float64)
        dist.all_reduce(total, group=dp.get_group())
        return float(total) / dp.size()
