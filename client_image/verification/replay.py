"""Replay verification: re-train a trainer's assigned batches and compare.

A DisTrO result depends on the trainer's private delta (its momentum and error
feedback), but every input of that delta is public: the weights all clients share, the
trainer's assigned batches, the run's schedule. A verifier that follows a trainer from a
point where its delta is zero (its join, a cold start) keeps a *shadow* trainer: its own
DistroTrainer on the verifier's model, fed the trainer's batches, whose results are what
an honest trainer publishes. Verification takes it through the ShadowTrainer port below
(the runtime builds it: runtime/worker.py), so it depends on the result format
(client_image/formats/) and not on training. The shadow never changes the verifier's weights (its
lookahead is undone exactly and it skips weight decay, `decay_weights=False`).

Error feedback follows the trainer: once the trainer's result of a step has arrived and
passed (`adopt`), the coefficients the trainer kept, not the shadow's own top-k, are what
leaves the shadow's momentum (their values the shadow's own). Otherwise one kept
coefficient that differs by rounding stays in one momentum and not the other and carries
into every later step, and honest distances grow over an epoch (docs/verification.md). A
result that fails is not adopted: the shadow continues from its own, so one deviation
does not mask the next.

An honest trainer's result differs from the shadow's only by numerics (thread counts,
bf16, another device); `Thresholds.from_honest` sets the limits from measured honest
distances with a margin. The cost is one forward/backward and one compression per
verified result: a verifier following one trainer does a trainer's work again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from client_image.formats.blocks import BlockPlan
from client_image.formats.distro_wire import DistroResult
from client_image.verification.similarity import Distances, similarity

KEPT_RECORDS = 4  # replayed steps whose record waits for the trainer's result


class Published(Protocol):
    """What one training step gives back (training's TrainStepOutput)."""

    @property
    def payload(self) -> bytes | None: ...


class ShadowTrainer(Protocol):
    """The trainer a verifier replays with, and an adversary's honest source: what
    verification needs of training/trainer.py's DistroTrainer, which is one."""

    @property
    def plans(self) -> Sequence[BlockPlan]: ...

    def decode(self, payload: bytes) -> DistroResult:
        """Validate a payload for this model; raises ResultDecodeError."""
        ...

    def train(self, step: int, batch: torch.Tensor, *, batch_id: tuple[int, int],
              cold_start: bool, decay_weights: bool) -> Published: ...

    # A record is the trainer's own (training's SentRecord): verification only keeps it.
    def sent_record(self) -> Any: ...

    def adopt_published(self, record: Any, published: DistroResult, trained_since: int,
                        later: Sequence[tuple[Any, int]] = ()) -> None: ...


@dataclass(frozen=True)
class Thresholds:
    """A result farther than any of these from the shadow's fails verification."""

    jaccard: float
    hamming: float
    manhattan: float

    @classmethod
    def from_honest(cls, honest: Sequence[Distances], margin: float = 3.0,
                    floor: float = 0.02) -> Thresholds:
        """margin x the largest honest distance, and never below `floor` (identical honest
        results would otherwise leave no room for the next machine's rounding)."""
        def limit(values: list[float]) -> float:
            return max(floor, margin * max(values, default=0.0))
        return cls(jaccard=limit([d.jaccard for d in honest]),
                   hamming=limit([d.hamming for d in honest]),
                   manhattan=limit([d.manhattan for d in honest]))


@dataclass(frozen=True)
class Verdict:
    ok: bool
    distances: Distances
    reason: str  # "" when ok, else which distances exceeded their thresholds


def judge(distances: Distances, thresholds: Thresholds) -> Verdict:
    over = [f"{name} {getattr(distances, name):.4f} > {getattr(thresholds, name):.4f}"
            for name in ("jaccard", "hamming", "manhattan")
            if getattr(distances, name) > getattr(thresholds, name)]
    return Verdict(not over, distances, "; ".join(over))


class ReplayVerifier:
    """Follows one trainer on the verifier's model (see the module docstring)."""

    def __init__(self, shadow: ShadowTrainer) -> None:
        """`shadow`: a trainer of the run's optimizer and schedule on the verifier's model,
        from a zero delta at the step the following starts."""
        self.shadow = shadow
        self.block_numels = [plan.block_numel for plan in self.shadow.plans]
        # Replayed steps since the last cold start, and their records until adopted (a
        # result arrives two rounds after its replay, so a few at most).
        self.trained: list[int] = []
        self.records: dict[int, Any] = {}

    def expected(self, step: int, batch: torch.Tensor, batch_id: tuple[int, int],
                 cold_start: bool = False) -> DistroResult:
        """What an honest trainer publishes for `batch` at `step`. Call it after the
        step's apply and before the verifier's own train of the step (which decays the
        weights)."""
        return self.shadow.decode(self.expected_payload(step, batch, batch_id, cold_start))

    def expected_payload(self, step: int, batch: torch.Tensor, batch_id: tuple[int, int],
                         cold_start: bool = False) -> bytes:
        """`expected`, as wire bytes (their SHA-256 is a report's evidence)."""
        out = self.shadow.train(step, batch, batch_id=batch_id, cold_start=cold_start,
                                decay_weights=False)
        assert out.payload is not None
        if cold_start:
            self.trained.clear()
            self.records.clear()
        self.trained.append(step)
        self.records[step] = self.shadow.sent_record()
        for old in [s for s in self.records if s < step - KEPT_RECORDS]:
            del self.records[old]
        del self.trained[:-KEPT_RECORDS - 1]
        return out.payload

    def adopt(self, step: int, published: DistroResult) -> None:
        """The trainer's result of `step` (replayed here, judged honest) becomes what left
        the shadow's momentum at that step (see the module docstring); a step not replayed
        here, or too old, is ignored."""
        record = self.records.pop(step, None)
        if record is None:
            return
        since = [s for s in self.trained if s > step]
        later = [(self.records[s], len([t for t in since if t <= s]))
                 for s in since if s in self.records]
        self.shadow.adopt_published(record, published, len(since), later)

    def distances(self, published: DistroResult, expected: DistroResult) -> Distances:
        return similarity(published.tensors, expected.tensors, self.block_numels).overall

    def verify(self, published: DistroResult, expected: DistroResult,
               thresholds: Thresholds) -> Verdict:
        return judge(self.distances(published, expected), thresholds)
