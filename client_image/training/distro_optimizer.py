"""DisTrO as a `torch.optim.Optimizer`, for any training loop.

    exchange = TorchDistributedExchange()            # or LocalExchange / your own
    optimizer = DisTrO(model.parameters(), config, exchange, lr=2e-3)
    for batch in data:
        optimizer.zero_grad()
        loss_of(model, batch).backward()             # any objective
        optimizer.step()

`step()` is DeMo's synchronous step (the DeMo reference optimizer's), with Psyche's
compression and this project's wire format:

    clip             grad *= c / (||grad|| + 1e-6)           if ||grad|| > c
    error feedback   delta -= decompress(own last result)
    weight decay     theta *= 1 - lr * weight_decay
    momentum         delta = compression_decay * delta + lr * grad
    publish          payload = encode(compress(delta))       (formats/distro_wire.py)
    exchange         every worker's payload of this step      (the ResultExchange)
    apply            theta -= lr * sign(decompress(all payloads))

The client's DistroTrainer runs the same math pipelined over rounds (the update of step
s lands at s + 2, with a lookahead); this optimizer applies each step at once, which is
what a plain data-parallel loop wants. Both run the one DisTrO step of distro_step.py.
Workers stay bit-identical: they apply the same payloads, in the exchange's order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from client_image.formats.distro_wire import ResultStream, encode_slots
from client_image.training.distro import plan_model
from client_image.training.distro_step import DistroStep, WholeParameters, payload_slots
from coordinator.config import DistroOptimizer


class ResultExchange(Protocol):
    """Moves one step's compressed results between the workers."""

    def exchange(self, step: int, payload: bytes) -> list[bytes]:
        """Publish this worker's payload of `step`; return every worker's (this one's
        included) in an order all workers agree on."""
        ...


class LocalExchange:
    """One worker alone: its own payload is the whole step (a single-process run)."""

    def exchange(self, step: int, payload: bytes) -> list[bytes]:
        del step
        return [payload]


class TorchDistributedExchange:
    """The workers of a torch.distributed process group (gloo or NCCL): an all-gather of
    the payloads, in rank order."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    def exchange(self, step: int, payload: bytes) -> list[bytes]:
        gathered: list[object] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(gathered, (step, payload), group=self.group)
        out = []
        for rank, item in enumerate(gathered):
            if not isinstance(item, tuple) or item[0] != step or not isinstance(item[1], bytes):
                raise RuntimeError(f"rank {rank} sent no payload of step {step}")
            out.append(item[1])
        return out


class DisTrO(torch.optim.Optimizer):
    """DisTrO over `params` (one group; `lr` may be changed between steps, as schedulers do)."""

    def __init__(self, params: Iterable[torch.Tensor], config: DistroOptimizer,
                 exchange: ResultExchange, lr: float) -> None:
        super().__init__(params, {"lr": lr})
        if len(self.param_groups) != 1:
            raise ValueError("DisTrO takes one parameter group")
        self.config = config
        self.exchange = exchange
        self.params: list[torch.Tensor] = list(self.param_groups[0]["params"])
        if any(isinstance(p, DTensor) for p in self.params):
            raise ValueError("DisTrO takes plain tensors: a model sharded with FSDP2 or tensor "
                             "parallelism trains with the client's ShardedDistroTrainer "
                             "(training/sharded.py)")
        self.plans = plan_model([(f"param{i}", p.shape) for i, p in enumerate(self.params)],
                                config.compression_chunk, config.compression_topk)
        self.distro = DistroStep(self.params, self.plans, WholeParameters())  # distro_step.py
        self.steps_taken = 0

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]  # no closure: a step exchanges with peers once
        if closure is not None:
            raise ValueError("DisTrO.step takes no closure")
        lr = float(self.param_groups[0]["lr"])
        if self.config.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.config.clip_grad_norm)
        distro = self.distro
        distro.error_feedback()
        distro.decay_weights(lr, self.config.weight_decay)
        distro.momentum([p.grad for p in self.params], lr, self.config.compression_decay)
        one_bit = self.config.quantize_1bit
        payload = encode_slots(payload_slots(distro.compress(), distro.chunks, one_bit),
                               self.plans, step=self.steps_taken, trainer_nonce=0,
                               batch_start=0, batch_end=0, one_bit=one_bit)
        payloads = self.exchange.exchange(self.steps_taken, payload)
        distro.apply([ResultStream(p, self.plans) for p in payloads], lr)
        self.steps_taken += 1
