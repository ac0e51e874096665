"""One client's SparseLoCo trainer: the round pipeline of training/sparseloco.py.

Per round s (the client's weights theta are the shared model; e: the error feedback):

 1. apply(s, results of round s-2)  theta -= outer_lr * mean(results)   (as DisTrO's apply,
                                    nothing at heights 0 and 1 of an epoch)
 2. train(s, batch):
      start       saved = theta; lookahead: theta -= outer_lr * (own result of s-1)
      inner loop  the batch cut into inner_steps equal parts; an AdamW step on each,
                  inner step j of round s at lr = inner_lr * schedule(s * H + j) / base_lr
                  (the schedule counts inner steps, as DiLoCo's inner optimizer does; its
                  AdamW state lives on across rounds)
      pseudo-gradient  Delta = (theta at the start of the inner loop) - theta
      restore     theta = saved (exact copy: every client holds the same weights)
      compress    e = error_decay * e + Delta;  g = Q(TopK(e));  e -= g
      publish     g -> wire bytes (sparseloco_wire.py)

The lookahead plays the part DisTrO's does: a round's update reaches the weights two
rounds later, so the inner loop starts where this client's own last result will have
moved them, and Delta counts only the progress beyond it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

import torch

from client_image.formats.blocks import BlockPlan, SparseResult
from client_image.formats.distro_wire import DistroResult, ResultDecodeError
from client_image.training.distro import BlockLayout
from client_image.training.lr import cold_start_factor, scheduled_lr
from client_image.training.objective import LossFn, causal_lm_loss
from client_image.training.precision import ComputeDType
from client_image.training.sparseloco import (
    compress_error,
    mean_update,
    plan_model,
    split_groups,
    subtract_sent,
)
from client_image.training.sparseloco_wire import (
    SparseLoCoStream,
    decode_sparseloco,
    encode_sparseloco,
)
from client_image.training.trainer import (
    Timings,
    TrainStepOutput,
    clip_gradients,
    trainable_parameters,
)
from coordinator.config import LRSchedule, SparseLoCoOptimizer

logger = logging.getLogger(__name__)


class SparseLoCoTrainer:
    """SparseLoCo for one client, with DistroTrainer's surface (decode, apply_payloads,
    train, idle, reset_delta), so the runtime drives either. Thread-unsafe."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: SparseLoCoOptimizer,
        lr_schedule: LRSchedule,
        *,
        micro_batch_size: int,
        cold_start_warmup_steps: int = 0,
        start_step: int = 0,
        compute: ComputeDType = "fp32",
        loss_fn: LossFn = causal_lm_loss,
        lookahead: bool = True,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.model = model
        self.config = optimizer
        self.lr_schedule = lr_schedule
        self.micro_batch_size = micro_batch_size
        self.cold_start_warmup_steps = cold_start_warmup_steps
        self.start_step = start_step
        self.compute = compute
        self.loss_fn = loss_fn
        self.lookahead = lookahead
        named = trainable_parameters(model)
        self.names = [name for name, _ in named]
        self.params: list[torch.Tensor] = [p for _, p in named]
        self.plans: list[BlockPlan] = plan_model(
            [(name, p.shape) for name, p in named], optimizer.chunk, optimizer.topk_density,
            optimizer.dense_max_numel)
        self.layout = BlockLayout(self.plans)
        self.error = self.layout.zeros(torch.float32, self.params[0].device)
        self.inner = torch.optim.AdamW(self.params, lr=0.0, betas=optimizer.inner_betas,
                                       weight_decay=optimizer.inner_weight_decay, eps=1e-8)
        # Nesterov outer momentum on the applied mean update (only with outer_momentum > 0):
        # every client applies the same G, so every client holds the same buffer.
        self.outer_velocity = ([torch.zeros_like(p) for p in self.params]
                               if optimizer.outer_momentum else [])
        self.trainer_nonce = 0
        self.timings = Timings()
        # This client's last result and its round: the look-ahead uses it only when it is
        # of the round before (a result of any earlier round is in theta already).
        self._own_last: tuple[int, list[SparseResult]] | None = None

    # ------------------------------------------------------------------ schedule
    def inner_learning_rates(self, step: int) -> list[float]:
        """The inner AdamW rates of round `step`: the schedule's shape over inner steps,
        scaled to peak at inner_lr (and the cold-start factor of the round)."""
        base = self.lr_schedule.base_lr
        h = self.config.inner_steps
        if base == 0:
            return [0.0] * h
        factor = cold_start_factor(step, self.start_step, self.cold_start_warmup_steps)
        scale = self.config.inner_lr / base * factor
        return [scale * scheduled_lr(self.lr_schedule, step * h + j) for j in range(h)]

    def learning_rate(self, step: int) -> float:
        """The round's largest inner rate: 0 only when the round cannot move the weights
        (what the cheap checks compare a result with, verification/checks.py)."""
        return max(self.inner_learning_rates(step))

    # ------------------------------------------------------------------ results
    def decode(self, payload: bytes, expected_step: int | None = None) -> DistroResult:
        started = time.perf_counter()
        result = decode_sparseloco(payload, self.plans, self.config.quant_bits)
        if expected_step is not None and result.step != expected_step:
            raise ResultDecodeError(f"payload is for step {result.step}, expected {expected_step}")
        self.timings.decompress_s += time.perf_counter() - started
        return result

    def apply(self, step: int, results: Sequence[DistroResult]) -> bool:
        """theta -= outer_lr * mean(results of step - 2). False if there are none."""
        return self._apply_sources(step, [r for r in results if r.step == step - 2])

    def apply_payloads(self, step: int, payloads: Sequence[bytes]) -> int:
        """`apply` from wire bytes, one parameter of one peer decoded at a time."""
        streams = []
        for payload in payloads:
            try:
                stream = SparseLoCoStream(payload, self.plans, self.config.quant_bits)
            except ResultDecodeError as exc:
                logger.error("step %d: dropping a payload that no longer decodes: %s", step, exc)
                continue
            if stream.step != step - 2:
                logger.warning("step %d: dropping a result of step %d", step, stream.step)
                continue
            streams.append(stream)
        return len(streams) if self._apply_sources(step, streams) else 0

    @torch.no_grad()
    def _apply_sources(self, step: int, sources: Sequence[DistroResult | SparseLoCoStream]
                       ) -> bool:
        if not sources:
            logger.warning("step %d: no results to apply, weights unchanged", step)
            return False
        started = time.perf_counter()
        mu = self.config.outer_momentum
        for i, (param, plan) in enumerate(zip(self.params, self.plans, strict=True)):
            update = mean_update([source.tensor(i) for source in sources], plan,
                                 param.dtype, param.device)
            if mu:  # v = mu v + G; theta -= lr (G + mu v)
                velocity = self.outer_velocity[i]
                velocity.mul_(mu).add_(update)
                update.add_(velocity, alpha=mu)
            param.sub_(update, alpha=self.config.outer_lr)
        self.timings.apply_s += time.perf_counter() - started
        return True

    def reset_delta(self) -> None:
        """Forget the error feedback and the lookahead (an epoch's fresh start)."""
        with torch.no_grad():
            torch._foreach_zero_(self.error)
            if self.outer_velocity:
                torch._foreach_zero_(self.outer_velocity)
        self._own_last = None

    def idle(self, step: int) -> None:
        """A round this client sits out: its weights change only through apply."""

    # ------------------------------------------------------------------ training
    def inner_batches(self, batch: torch.Tensor) -> Iterator[torch.Tensor]:
        """The round's batch cut into inner_steps parts (the first ones one longer when it
        does not divide; fewer parts when there are fewer samples than steps)."""
        parts = min(self.config.inner_steps, len(batch))
        base, extra = divmod(len(batch), parts)
        start = 0
        for part in range(parts):
            size = base + (1 if part < extra else 0)
            yield batch[start : start + size]
            start += size

    def train(self, step: int, batch: torch.Tensor, *, batch_id: tuple[int, int] = (0, 0),
              cold_start: bool = False, decay_weights: bool = True) -> TrainStepOutput:
        """Run the inner loop on `batch` and produce this round's payload. The weights end
        exactly as they were (`decay_weights` is DistroTrainer's; weight decay is the inner
        AdamW's here)."""
        del decay_weights
        rates = self.inner_learning_rates(step)
        started = time.perf_counter()
        with torch.no_grad():
            if cold_start:
                self.reset_delta()
            saved = [p.detach().clone() for p in self.params]
            if self.lookahead and self._own_last is not None and self._own_last[0] == step - 1:
                own = self._own_last[1]
                for i, (param, plan) in enumerate(zip(self.params, self.plans, strict=True)):
                    param.sub_(mean_update([own[i]], plan, param.dtype, param.device),
                               alpha=self.config.outer_lr)
            start = [p.detach().clone() for p in self.params]
        self.timings.apply_s += time.perf_counter() - started

        losses, grad_norm = [], 0.0
        device = self.params[0].device
        for lr, part in zip(rates, self.inner_batches(batch.to(device)), strict=False):
            for group in self.inner.param_groups:
                group["lr"] = lr
            started = time.perf_counter()
            self.inner.zero_grad(set_to_none=True)
            losses.append(self.loss_fn(self.model, part, self.micro_batch_size, self.compute))
            grad_norm = clip_gradients(self.params, self.config.clip_grad_norm)
            self.timings.forward_backward_s += time.perf_counter() - started
            started = time.perf_counter()
            if lr:
                self.inner.step()
            self.timings.apply_s += time.perf_counter() - started
        self.inner.zero_grad(set_to_none=True)

        started = time.perf_counter()
        with torch.no_grad():
            delta = torch._foreach_sub(start, self.params)  # Delta = start - theta
            torch._foreach_copy_(self.params, saved)
            del saved, start
            torch._foreach_mul_(self.error, self.config.error_decay)
            self.layout.add_from(self.error, delta, alpha=1.0)
            del delta
            groups = compress_error(self.error, self.layout, self.config.quant_bits)
            subtract_sent(self.error, groups)
            payload = encode_sparseloco(
                groups, self.plans, self.layout.slots, quant_bits=self.config.quant_bits,
                step=step, trainer_nonce=self.trainer_nonce, batch_start=batch_id[0],
                batch_end=batch_id[1])
            self._own_last = (step, split_groups(groups, self.layout))
        self.timings.compress_s += time.perf_counter() - started
        self.trainer_nonce += 1
        loss = sum(losses) / len(losses) if losses else 0.0
        return TrainStepOutput(step, loss, payload, grad_norm,
                               learning_rate=self.learning_rate(step))
