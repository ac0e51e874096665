"""A follower (verification/followers.py) on the real tiny model: an honest trainer's
results verify with all distances 0, and every live attack (verification/adversary.py)
fails within three steps; the evidence hashes are those of the two payloads."""

import hashlib

import pytest
import torch
from follower_setup import (
    SCHEDULE,
    follower_test_optimizer,
    followers_on,
    replay_and_train,
    step_batches,
    tiny_model,
)

from client_image.training.trainer import DistroTrainer
from client_image.verification.adversary import LIVE_ATTACKS, Adversary
from client_image.verification.settings import capture
from client_image.verification.similarity import Distances

TRAINER = b"\x07" * 32


def verdicts(kind: str | None, one_bit: bool = False, steps: int = 3
             ) -> list[tuple[bool, Distances]]:
    opt = follower_test_optimizer(one_bit)
    declared = capture("fp32", 2, "cpu")
    trainer = DistroTrainer(tiny_model(), opt, SCHEDULE, micro_batch_size=2, declared=declared)
    follower_model = tiny_model()
    own = DistroTrainer(follower_model, opt, SCHEDULE, micro_batch_size=2)
    followers = followers_on(follower_model, declared, opt)
    followers.follow([TRAINER], start_step=1)
    adversary = Adversary(kind) if kind else None
    out = []
    for step, batch_id, tokens in step_batches(range(1, steps + 1)):
        trained = replay_and_train(followers, TRAINER, trainer, step, tokens, batch_id,
                                   trained_tokens=adversary.batch(tokens) if adversary else None)
        payload = adversary.payload(trained, trainer) if adversary else trained
        checked = followers.verify(TRAINER, step, payload)
        assert checked is not None
        assert checked.published_hash == hashlib.sha256(payload).digest()
        out.append((checked.verdict.ok, checked.verdict.distances))
        own.idle(step)
        for ours, theirs in zip(own.params, trainer.params, strict=True):
            assert torch.equal(ours, theirs)  # the shadow never moves the follower's weights
    assert followers.verify(TRAINER, steps + 5, b"") is None  # nothing replayed for it
    return out


@pytest.mark.parametrize("one_bit", [False, True])
def test_an_honest_trainer_verifies_exactly(one_bit: bool) -> None:
    assert verdicts(None, one_bit) == [(True, Distances(0.0, 0.0, 0.0))] * 3


@pytest.mark.parametrize("kind", LIVE_ATTACKS)
def test_every_live_attack_fails_verification(kind: str) -> None:
    results = verdicts(kind)
    assert not all(ok for ok, _ in results), results


def test_with_1_bit_results_a_scaled_result_is_the_honest_one_and_others_still_fail() -> None:
    """The wire carries only signs: scaling changes nothing that is sent."""
    assert all(ok for ok, _ in verdicts("scaled", one_bit=True))
    for kind in ("random_signs", "wrong_batch", "flipped_signs"):
        assert not all(ok for ok, _ in verdicts(kind, one_bit=True)), kind


def test_an_unknown_adversary_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown adversary 'copy'"):
        Adversary("copy")
