"""One client's DisTrO trainer: the per-step pipeline, overlapped
(docs/distro.md, "Per-step pipeline").

Per step s (delta: a persistent buffer per parameter, zero at the start):

 1. apply(s, results of step s-2)   theta -= lr(s) * sign(decompress(results))
                                    (nothing at heights 0 and 1 of an epoch)
 2. train(s, batch):
      cold start                    delta = 0
      lookahead                     theta -= lr(s-1) * sign(delta)        (lr(0) at s = 0)
      forward/backward              grad = mean over micro-batches of dCE/dtheta
      clip                          grad *= c / (||grad||_2 + 1e-6)      if ||grad|| > c
      undo lookahead                theta = saved theta (exact, see train())
      error feedback                delta -= decompress(own last result, unquantized)
      weight decay                  theta *= 1 - lr(s) * weight_decay
      momentum                      delta = compression_decay * delta + lr(s) * grad
      publish                       compress(delta) -> wire bytes (signs only if 1-bit)

The update of step s reaches the weights at step s+2 (while s+1 trains); the lookahead
approximates the still-missing update of s-1 by this client's own sign(delta).

One deliberate difference from Psyche: error feedback subtracts this client's last
published result even when it was not of step s-1 (the client sat out a round), instead
of never subtracting it; for consecutive steps the two are identical.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from client_image.formats.blocks import BlockPlan
from client_image.formats.distro_wire import (
    DistroResult,
    ResultDecodeError,
    ResultStream,
    decode_result,
    encode_slots,
)
from client_image.formats.replay_settings import ReplaySettings
from client_image.training.distro import plan_model
from client_image.training.distro_step import (
    DistroStep,
    ParameterView,
    PendingSlots,
    ResultSource,
    SentRecord,
    WholeParameters,
    add_decoded_difference,
    coefficients_at,
    start_payload_copy,
)
from client_image.training.lr import cold_start_factor, scheduled_lr
from client_image.training.objective import LossFn, causal_lm_loss
from client_image.training.precision import ComputeDType
from coordinator.config import AdamWOptimizer, DistroOptimizer, LRSchedule

logger = logging.getLogger(__name__)


class _StepResult(ResultSource, Protocol):
    """A result that says its step (distro_wire.DistroResult, distro_wire.ResultStream)."""

    step: int


_R = TypeVar("_R", bound=_StepResult)


@dataclass
class Timings:
    """Seconds spent, accumulated over steps (the benchmark's overhead figure)."""

    forward_backward_s: float = 0.0
    compress_s: float = 0.0  # delta update, DCT, top-k, wire encoding
    decompress_s: float = 0.0  # wire decoding, aggregation, inverse DCT (own and peers')
    apply_s: float = 0.0  # sign step, lookahead, weight decay

    @property
    def optimizer_s(self) -> float:
        return self.compress_s + self.decompress_s + self.apply_s


@dataclass
class TrainStepOutput:
    step: int
    loss: float  # mean next-token cross-entropy over the batch
    payload: bytes | None  # this step's result in the wire format (None for AdamW)
    grad_norm: float  # the gradient's total L2 norm before clipping
    ranks: int = 1  # processes that trained it (D x T, training/sharded.py)
    learning_rate: float = 0.0  # the schedule's at this step (cold-start factor included)


class PendingTrainStep:
    """A trained step whose payload is still being copied to the host
    (DistroTrainer.train_async): result() waits for the copy, encodes the wire bytes and
    gives the step's TrainStepOutput, the same bytes as train() gives. Work queued on the
    device before result() (the next step's apply and forward) overlaps the copy."""

    def __init__(self, trainer: DistroTrainer, output: TrainStepOutput, slots: PendingSlots,
                 nonce: int, batch_id: tuple[int, int]) -> None:
        self.trainer = trainer
        self.output = output
        self.slots = slots
        self.nonce = nonce
        self.batch_id = batch_id
        self.payload: bytes | None = None

    def ready(self) -> bool:
        """Whether result() would not wait for the copy."""
        return self.payload is not None or self.slots.ready()

    def result(self) -> TrainStepOutput:
        if self.payload is None:
            started = time.perf_counter()
            one_bit = self.trainer.config.quantize_1bit
            self.payload = encode_slots(
                self.slots.wait(), self.trainer.plans, step=self.output.step,
                trainer_nonce=self.nonce, batch_start=self.batch_id[0],
                batch_end=self.batch_id[1], one_bit=one_bit, settings=self.trainer.declared,
            )
            self.trainer.timings.compress_s += time.perf_counter() - started
            self.output.payload = self.payload
        return self.output


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters DisTrO updates, in the model's stable registration order."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def token_row_parameters(model: torch.nn.Module,
                         named: Sequence[tuple[str, torch.nn.Parameter]]) -> set[str]:
    """Names of the parameters whose rows are tokens: the input embedding's and the output
    head's weights (transformers' get_input_embeddings / get_output_embeddings)."""
    weights = []
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, getter, lambda: None)()
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor):
            weights.append(weight)
    return {name for name, p in named if any(p is w for w in weights)}


def distro_plans(model: torch.nn.Module, named: Sequence[tuple[str, torch.nn.Parameter]],
                 optimizer: DistroOptimizer) -> list[BlockPlan]:
    """The BlockPlans of a model's trainable parameters for a run's DisTrO settings."""
    token_rows = token_row_parameters(model, named) if optimizer.embeddings_per_token else set()
    return plan_model([(name, p.shape) for name, p in named], optimizer.compression_chunk,
                      optimizer.compression_topk, token_rows)


class DistroTrainer:
    """DisTrO for one client. Thread-unsafe; the runtime calls it from one worker thread.

    >>> trainer = DistroTrainer(model, DistroOptimizer(...), CosineLR(...), micro_batch_size=4)
    >>> trainer.apply(step, [trainer.decode(p) for p in payloads_of_step_minus_2])
    >>> out = trainer.train(step, batch, batch_id=(start, end))   # out.payload: bytes to publish
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: DistroOptimizer,
        lr_schedule: LRSchedule,
        *,
        micro_batch_size: int,
        cold_start_warmup_steps: int = 0,
        start_step: int = 0,
        compute: ComputeDType = "fp32",
        buffer_dtype: torch.dtype = torch.float32,
        loss_fn: LossFn = causal_lm_loss,
        view: ParameterView | None = None,
        device: torch.device | str | None = None,
        compile_kernels: bool = False,
        declared: ReplaySettings | None = None,
    ) -> None:
        """`declared`: the settings this trainer trains in, written into every result's
        header for its followers to replay in (formats/replay_settings.py); None declares
        nothing (followers then judge with the loose limits)."""
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if declared is not None and (declared.micro_batch != micro_batch_size
                                     or declared.compute != compute):
            raise ValueError(f"declared {declared.describe()} but the trainer runs "
                             f"{compute} micro-batch {micro_batch_size}")
        self.declared = declared
        self.model = model
        self.compute = compute
        self.config = optimizer
        self.lr_schedule = lr_schedule
        self.micro_batch_size = micro_batch_size
        self.loss_fn = loss_fn
        self.cold_start_warmup_steps = cold_start_warmup_steps
        self.start_step = start_step
        named = trainable_parameters(model)
        self.names = [name for name, _ in named]
        self.params: list[torch.Tensor] = [p for _, p in named]
        # A DTensor's shape is the full parameter's: every layout has the same plans.
        self.plans: list[BlockPlan] = distro_plans(model, named, optimizer)
        # The update itself (distro_step.py); delta is fp32 whatever the parameters' dtype
        # (precision.py, "DisTrO buffers"; bf16 only to measure why not).
        self.distro = DistroStep(self.params, self.plans, view or WholeParameters(),
                                 buffer_dtype=buffer_dtype, device=device,
                                 compile_kernels=compile_kernels)
        self.trainer_nonce = 0  # train() calls since this process started
        self.timings = Timings()

    @property
    def delta(self) -> list[torch.Tensor]:
        """The momentum buffers, shaped and placed like the parameters."""
        return self.distro.delta

    def delta_tensors(self) -> list[torch.Tensor]:
        """The momentum buffer as whole parameter-shaped copies (for inspection and tests)."""
        return [t.clone() for t in self.distro.view.full(self.distro.delta)]

    def sent_record(self) -> SentRecord:
        """After a train(): delta as it was compressed and what this trainer kept of it. A
        verifier's shadow keeps it until the followed trainer's result of the step arrives
        (adopt_published)."""
        assert self.distro.sent is not None, "sent_record() before any train()"
        return SentRecord(self.delta_tensors(), self.distro.sent)

    @torch.no_grad()
    def adopt_published(self, record: SentRecord, published: DistroResult, trained_since: int,
                        later: Sequence[tuple[SentRecord, int]] = ()) -> None:
        """A verifier's shadow only (the trainer's own path never calls it): make what the
        followed trainer published for `record`'s step the part that leaves delta at error
        feedback, instead of the shadow's own top-k, so the shadow's momentum stays in step
        with the trainer's and one differing kept coefficient does not carry into every
        later step (docs/verification.md). The kept set is the trainer's, its values are
        `record.delta`'s own coefficients there (the wire carries them quantized or as
        signs). `trained_since`: train()s since that step; the first subtracted the shadow's
        own result and each decayed it once, so the difference is added with
        compression_decay ** trained_since (exact: delta is linear in what was subtracted).
        `later`: the kept records of those steps, each with the train()s up to it, corrected
        the same way."""
        distro = self.distro
        sent = coefficients_at(distro, record.delta, published.tensors)
        if trained_since == 0:
            distro.sent = sent  # not subtracted yet: the next train() subtracts it
            return
        decay = self.config.compression_decay
        targets = [(distro.delta, decay ** trained_since)]
        targets += [(kept.delta, decay ** trains) for kept, trains in later]
        add_decoded_difference(distro, record.sent, sent, targets)
        # The shadow's own result of its last step, not yet subtracted, was picked from
        # delta before this correction; picked again from the corrected delta, it is the
        # best guess of what the trainer sent. (Left as it was, the difference just
        # corrected would be subtracted from delta once more with the next step's guess,
        # and every later correction would come a step too late: it never dies out.)
        guess = distro.compress()
        if later and later[-1][1] == trained_since:
            later[-1][0].sent = guess

    def learning_rate(self, step: int) -> float:
        """lr(s) = schedule(s) x cold-start factor."""
        factor = cold_start_factor(step, self.start_step, self.cold_start_warmup_steps)
        return scheduled_lr(self.lr_schedule, step) * factor

    def decode(self, payload: bytes, expected_step: int | None = None) -> DistroResult:
        """Validate a peer's payload for this model (and step); raises ResultDecodeError."""
        started = time.perf_counter()
        result = decode_result(payload, self.plans)
        if expected_step is not None and result.step != expected_step:
            raise ResultDecodeError(f"payload is for step {result.step}, expected {expected_step}")
        if result.one_bit != self.config.quantize_1bit:
            raise ResultDecodeError(
                f"payload one_bit={result.one_bit}, the run's quantize_1bit={self.config.quantize_1bit}"
            )
        self.timings.decompress_s += time.perf_counter() - started
        return result

    @staticmethod
    def _results_of_step(step: int, results: Sequence[_R]) -> list[_R]:
        """The results of step - 2 among `results` (a warning for none or for others)."""
        if not results:
            logger.warning("step %d: no results to apply, weights unchanged", step)
            return []
        # The step field is the peer's word: a mismatch is dropped, never raised, so one
        # peer's payload cannot stop the round (decode(expected_step=...) rejects it earlier).
        stale = [r for r in results if r.step != step - 2]
        if stale:
            logger.warning(
                "step %d: dropping %d results of steps %s (expected %d)",
                step, len(stale), sorted({r.step for r in stale}), step - 2,
            )
        return [r for r in results if r.step == step - 2]

    def apply(self, step: int, results: Sequence[DistroResult]) -> bool:
        """Step 1: theta -= lr(step) * sign(mean of the peers' decoded results). False if none."""
        return self._apply_sources(step, self._results_of_step(step, results))

    def apply_payloads(self, step: int, payloads: Sequence[bytes]) -> int:
        """`apply` straight from the peers' wire bytes, decoded a chunk of parameters at a
        time (distro_step.py): the extra memory is a few chunks, whatever the number of
        peers (docs/distro.md, "Apply"). The payloads were accepted by `decode` on
        download; one whose header no longer parses is dropped with an error, never
        half-applied. Returns how many results were applied."""
        streams = []
        for payload in payloads:
            try:
                stream = ResultStream(payload, self.plans)
            except ResultDecodeError as exc:
                logger.error("step %d: dropping a payload that no longer decodes: %s", step, exc)
                continue
            if stream.one_bit != self.config.quantize_1bit:
                logger.error("step %d: dropping a payload with one_bit=%s", step, stream.one_bit)
                continue
            streams.append(stream)
        current = self._results_of_step(step, streams)
        return len(current) if self._apply_sources(step, current) else 0

    @torch.no_grad()
    def _apply_sources(self, step: int, current: Sequence[ResultSource]) -> bool:
        """theta -= lr(step) * sign(mean of the results of step - 2 in `current`)."""
        if not current:
            return False
        started = time.perf_counter()
        self.distro.apply(current, self.learning_rate(step))
        self.timings.decompress_s += time.perf_counter() - started
        return True

    def reset_delta(self) -> None:
        """Forget the momentum and the pending error feedback: with verification on every
        epoch starts here, so a follower can replay this trainer (verification/replay.py)."""
        with torch.no_grad():
            self.distro.reset()

    @torch.no_grad()
    def idle(self, step: int) -> None:
        """A step this client does not train while its peers do: only what train() does to
        the weights, weight decay, so that they stay bit-identical to the trainers' (train
        restores the lookahead exactly; the results arrive through apply)."""
        self.distro.decay_weights(self.learning_rate(step), self.config.weight_decay)

    def train(
        self,
        step: int,
        batch: torch.Tensor,
        *,
        batch_id: tuple[int, int] = (0, 0),
        cold_start: bool = False,
        decay_weights: bool = True,
    ) -> TrainStepOutput:
        """Step 2: train on `batch` ([n, seq_len] token ids, or a with_labels batch) and
        produce this step's payload.
        `decay_weights=False` leaves the weights exactly as they were (a verifier's shadow
        trainer, verification/replay.py)."""
        return self.train_async(step, batch, batch_id=batch_id, cold_start=cold_start,
                                decay_weights=decay_weights).result()

    def train_async(
        self,
        step: int,
        batch: torch.Tensor,
        *,
        batch_id: tuple[int, int] = (0, 0),
        cold_start: bool = False,
        decay_weights: bool = True,
    ) -> PendingTrainStep:
        """train() with the payload's copy to the host started, not waited for: call
        result() for the output (and its bytes) after queuing the next work (the next
        step's apply and forward), which then overlaps the copy on a GPU."""
        lr_now = self.learning_rate(step)
        lr_prev = self.learning_rate(max(step - 1, 0))
        distro = self.distro
        started = time.perf_counter()
        for param in self.params:
            param.grad = None
        with torch.no_grad():
            if cold_start:
                distro.reset()
            # The lookahead is undone by restoring a copy, not by adding the step back:
            # (theta - x) + x is not always theta in floating point, and clients that
            # must hold bit-identical weights each look ahead with their own delta.
            swap = bool(lr_prev) and distro.can_swap_lookahead()
            if swap:  # one device: the parameters point at the looked-ahead copy
                saved = distro.lookahead_swapped(lr_prev)
            else:
                saved = distro.save_weights() if lr_prev else []
                if lr_prev:
                    distro.lookahead(lr_prev)
        self.timings.apply_s += time.perf_counter() - started

        started = time.perf_counter()
        loss, grad_norm = self._forward_backward(batch)
        self.timings.forward_backward_s += time.perf_counter() - started

        with torch.no_grad():
            started = time.perf_counter()
            if swap:
                distro.restore_swapped(saved)
            elif lr_prev:
                distro.restore_weights(saved)
            del saved
            if decay_weights:
                distro.decay_weights(lr_now, self.config.weight_decay)
            applied_at = time.perf_counter()
            self.timings.apply_s += applied_at - started
            distro.error_feedback()  # what was transmitted last step leaves the buffer
            decompressed_at = time.perf_counter()
            self.timings.decompress_s += decompressed_at - applied_at
            distro.momentum([p.grad for p in self.params], lr_now, self.config.compression_decay)
            one_bit = self.config.quantize_1bit
            slots = start_payload_copy(distro.compress(), distro.chunks, one_bit)
            self.timings.compress_s += time.perf_counter() - decompressed_at
        nonce = self.trainer_nonce
        self.trainer_nonce += 1
        output = TrainStepOutput(step, loss, None, grad_norm, ranks=self._ranks(),
                                 learning_rate=lr_now)
        return PendingTrainStep(self, output, slots, nonce, batch_id)

    def _forward_backward(self, batch: torch.Tensor) -> tuple[float, float]:
        """(mean loss, gradient norm before clipping), the gradients clipped in place."""
        loss = self.loss_fn(self.model, batch.to(self.params[0].device), self.micro_batch_size,
                            self.compute)
        return loss, clip_gradients(self.params, self.config.clip_grad_norm)

    def _ranks(self) -> int:
        return 1


class AdamWTrainer:
    """The dense baseline: AdamW on the mean gradient (what an all-reduce would give)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: AdamWOptimizer,
        lr_schedule: LRSchedule,
        *,
        micro_batch_size: int,
        compute: ComputeDType = "fp32",
    ) -> None:
        self.model = model
        self.compute = compute
        self.config = optimizer
        self.lr_schedule = lr_schedule
        self.micro_batch_size = micro_batch_size
        self.params: list[torch.Tensor] = [p for _, p in trainable_parameters(model)]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=0.0, betas=optimizer.betas, eps=optimizer.eps,
            weight_decay=optimizer.weight_decay,
        )
        self.timings = Timings()

    def learning_rate(self, step: int) -> float:
        return scheduled_lr(self.lr_schedule, step)

    def train(self, step: int, batch: torch.Tensor, **_: object) -> TrainStepOutput:
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = causal_lm_loss(self.model, batch.to(self.params[0].device), self.micro_batch_size,
                              self.compute)
        grad_norm = clip_gradients(self.params, self.config.clip_grad_norm)
        self.timings.forward_backward_s += time.perf_counter() - started
        started = time.perf_counter()
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(step)
        self.optimizer.step()
        self.timings.apply_s += time.perf_counter() - started
        return TrainStepOutput(step, loss, None, grad_norm,
                               learning_rate=self.learning_rate(step))


def clip_gradients(params: Sequence[torch.Tensor], max_norm: float | None) -> float:
    """Global L2 clipping: grad *= c / (norm + 1e-6) when norm > c. Returns the norm."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if max_norm is None:
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
