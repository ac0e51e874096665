"""A client's shadows of the trainers it follows this epoch (coordinator/verification.py
elects who follows whom; replay.py is the shadow itself).

    follow(trainers)                  at the epoch's first round: one shadow per trainer,
                                      each from a zero delta (every trainer reset its own
                                      at the epoch's start)
    replay(trainer, step, batch)      after the step's apply, before this client's own
                                      train: what the trainer should publish for `batch`
    verify(trainer, step, published)  when the step's consensus result is applied: the
                                      distances and the verdict

Thresholds: every distance of an honest replay in the trainer's compute dtype measured 0
(fp32 and bf16, other thread counts: bench/verification.py), so the floor of
`Thresholds.from_honest` (0.02) leaves room for another machine's rounding only. A swarm
whose clients train in different dtypes must not turn verification on (a bf16 trainer vs an
fp32 shadow measured Jaccard 0.71); GPU-vs-GPU noise is not measured yet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from client_image.formats.distro_wire import ResultDecodeError
from client_image.verification.replay import (
    ReplayVerifier,
    ShadowTrainer,
    Thresholds,
    Verdict,
    judge,
)
from client_image.verification.similarity import Distances

DEFAULT_THRESHOLDS = Thresholds.from_honest([])
KEPT_STEPS = 4  # expected results wait for their step's apply, two rounds later


@dataclass(frozen=True)
class Checked:
    """One verified result: the verdict and the evidence a report carries."""

    verdict: Verdict
    published_hash: bytes
    expected_hash: bytes


class Followers:
    def __init__(self, make_shadow: Callable[[int], ShadowTrainer], *,
                 thresholds: Thresholds = DEFAULT_THRESHOLDS):
        """`make_shadow(start_step)`: a fresh shadow trainer (replay.py) from a zero delta
        at `start_step`, on this client's model with the run's optimizer and schedule."""
        self.make_shadow = make_shadow
        self.thresholds = thresholds
        self.shadows: dict[bytes, ReplayVerifier] = {}
        self.expected: dict[tuple[bytes, int], bytes] = {}

    def follow(self, trainers: Sequence[bytes], start_step: int) -> None:
        """Shadows for exactly `trainers`, all starting from a zero delta."""
        self.expected.clear()
        self.shadows = {key: ReplayVerifier(self.make_shadow(start_step)) for key in trainers}

    def replay(self, trainer: bytes, step: int, batch: torch.Tensor,
               batch_id: tuple[int, int], cold_start: bool) -> None:
        shadow = self.shadows.get(trainer)
        if shadow is None:
            return
        self.expected[(trainer, step)] = shadow.expected_payload(step, batch, batch_id,
                                                                 cold_start)
        for key in [k for k in self.expected if k[1] <= step - KEPT_STEPS]:
            del self.expected[key]

    def verify(self, trainer: bytes, step: int, published: bytes) -> Checked | None:
        """None when `trainer`'s batch of `step` was not replayed here."""
        shadow = self.shadows.get(trainer)
        expected = self.expected.pop((trainer, step), None)
        if shadow is None or expected is None:
            return None
        digest = hashlib.sha256(published).digest()
        expected_hash = hashlib.sha256(expected).digest()
        try:
            result = shadow.shadow.decode(published)
        except ResultDecodeError as exc:  # verified on download: never expected here
            worst = Distances(jaccard=1.0, hamming=1.0, manhattan=1.0)
            return Checked(Verdict(False, worst, f"undecodable: {exc}"), digest, expected_hash)
        distances = shadow.distances(result, shadow.shadow.decode(expected))
        return Checked(judge(distances, self.thresholds), digest, expected_hash)
