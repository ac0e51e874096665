"""A follower (verification/followers.py) on the real tiny model: an honest trainer's
results verify with all distances 0, and every live attack (verification/adversary.py)
fails within three steps; the evidence hashes are those of the two payloads."""

import hashlib

import pytest
import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer
from client_image.verification.adversary import LIVE_ATTACKS, Adversary
from client_image.verification.followers import Followers
from client_image.verification.settings import capture
from client_image.verification.similarity import Distances
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider


def optimizer(one_bit: bool) -> DistroOptimizer:
    return DistroOptimizer(compression_decay=0.999, compression_topk=8, compression_chunk=64,
                           quantize_1bit=one_bit, clip_grad_norm=1.0, weight_decay=0.1)
SCHEDULE = ConstantLR(base_lr=1e-3, warmup_init_lr=1e-4, warmup_steps=2)
TRAINER = b"\x07" * 32


def verdicts(kind: str | None, one_bit: bool = False, steps: int = 3
             ) -> list[tuple[bool, Distances]]:
    opt = optimizer(one_bit)
    data = LocalDataProvider(TRAIN_DATA, 32)
    declared = capture("fp32", 2, "cpu")
    trainer = DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"), opt, SCHEDULE,
                            micro_batch_size=2, declared=declared)
    follower_model = load_causal_lm(TINY_MODEL, device="cpu")
    own = DistroTrainer(follower_model, opt, SCHEDULE, micro_batch_size=2)
    followers = Followers(lambda start, settings: DistroTrainer(
        follower_model, opt, SCHEDULE, micro_batch_size=settings.micro_batch,
        start_step=start, declared=settings), declared)
    followers.follow([TRAINER], start_step=1)
    adversary = Adversary(kind) if kind else None
    out = []
    for step in range(1, steps + 1):
        batch_id = (4 * step, 4 * step + 1)
        tokens = data.get_samples(*batch_id)
        followers.replay(TRAINER, step, tokens, batch_id, cold_start=False)
        trained = trainer.train(step, adversary.batch(tokens) if adversary else tokens,
                                batch_id=batch_id)
        assert trained.payload is not None
        payload = adversary.payload(trained.payload, trainer) if adversary else trained.payload
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
