"""A client's shadows of the trainers it follows this epoch (coordinator/verification.py
elects who follows whom; replay.py is the shadow itself).

    follow(trainers)                  at the epoch's first round: one shadow per trainer,
                                      each from a zero delta (every trainer reset its own
                                      at the epoch's start)
    replay(trainer, step, batch)      after the step's apply, before this client's own
                                      train: what the trainer should publish for `batch`
    verify(trainer, step, published)  when the step's consensus result is applied: the
                                      distances and the verdict

Thresholds (THRESHOLDS, by the compute dtype the follower replays in, the trainer's):
honest replays are not exact on another machine. Another thread count, micro-batch split
or SDPA kernel moves a result's top-k indices, and the difference compounds over the
epoch (Jaccard up to 0.62 in fp32 and 0.73 in bf16 over 16 steps); the signs of shared
slots almost never disagree (Hamming at most 0.0003 in fp32, 0.006 in bf16). The limits
are 3 x the largest honest distance, with floors (bench/verification.py; the figures and
what they leave undetected are in docs/verification.md, "Honest noise and thresholds").
A swarm whose clients train in different dtypes must not turn verification on; GPU noise
is not measured yet.
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

# The thresholds a follower judges with, by the compute dtype it replays in (the trainer's:
# a swarm trains in one dtype): 3 x the largest distance of 2,016 honest replays on other
# thread counts, micro-batch splits and SDPA kernels, floors 0.02 / 0.002 / 0.02
# (bench/verification.py, bench/results/verification_noise_2cores.txt; docs/verification.md
# "Honest noise and thresholds"). Honest noise compounds over an epoch's steps (the shadow
# continues from its own results), so Jaccard and Manhattan reach the attacks' range and
# their limits are past anything they can measure: replay judges by Hamming alone.
THRESHOLDS = {
    "fp32": Thresholds(jaccard=1.8739, hamming=0.002, manhattan=3.0563),
    "bf16": Thresholds(jaccard=2.1835, hamming=0.0177, manhattan=3.7406),
}
DEFAULT_THRESHOLDS = THRESHOLDS["bf16"]
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
        verdict = judge(distances, self.thresholds)
        if verdict.ok:  # the shadow's momentum follows what the trainer sent (replay.py)
            shadow.adopt(step, result)
        return Checked(verdict, digest, expected_hash)
