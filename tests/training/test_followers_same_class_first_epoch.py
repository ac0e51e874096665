"""A trainer of a follower's own replay class, seen for the first time (issue 36): the class
covers every setting a replay must match, so the follower replays it in its own settings
and judges it with the tight DECLARED_THRESHOLDS from round 0, before any result of it has
declared anything. An honest one passes bit-exactly; a lazy one (90 % of each sequence) and
a scaled one (x 1.05), which the loose limits let through, fail; one declaring another
micro-batch size than its class promised fails as of another class. Real trainers and real
followers on the CPU, in one process."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from follower_setup import (
    OPTIMIZER,
    SCHEDULE,
    followers_on,
    replay_and_train,
    step_batches,
    tiny_model,
)

from client_image.formats.blocks import SparseResult
from client_image.formats.distro_wire import encode_result
from client_image.formats.replay_settings import replay_class_of
from client_image.training.trainer import DistroTrainer
from client_image.verification.followers import (
    DECLARED_THRESHOLDS,
    OTHER_CLASS,
    SAME_CLASS_REPLAY,
    THRESHOLDS,
    Checked,
    Followers,
)
from client_image.verification.settings import capture

TRAINER = b"\x21" * 32
STEPS = 3


def honest(tokens: torch.Tensor) -> torch.Tensor:
    return tokens


def lazy_90(tokens: torch.Tensor) -> torch.Tensor:
    """Trains on the first 90 % of each sequence's tokens only."""
    return tokens[..., :round(0.9 * tokens.shape[-1])].contiguous()


def scaled(payload: bytes, trainer: DistroTrainer, factor: float = 1.05) -> bytes:
    """The honest result x `factor`, declared as the honest one was."""
    result = trainer.decode(payload)
    return encode_result([SparseResult(t.idx, t.val * factor) for t in result.tensors],
                         trainer.plans, step=result.step, trainer_nonce=result.trainer_nonce,
                         batch_start=result.batch_start, batch_end=result.batch_end,
                         one_bit=result.one_bit, settings=result.settings)


def first_epoch(batch: Callable[[torch.Tensor], torch.Tensor] = honest,
                payload: Callable[[bytes, DistroTrainer], bytes] | None = None,
                declared_micro_batch: int = 2, same_class: bool = True,
                ) -> tuple[Followers, list[Checked]]:
    """A follower's verdicts on TRAINER's first STEPS results, its declaration unknown at the
    epoch's start; `same_class`: TRAINER joined with the follower's class (else it is
    followed as a global follower)."""
    own = capture("fp32", 2, "cpu")
    declared = dataclasses.replace(own, micro_batch=declared_micro_batch)
    trainer = DistroTrainer(tiny_model(), OPTIMIZER, SCHEDULE,
                            micro_batch_size=declared_micro_batch, declared=declared)
    follower_model = tiny_model()
    # the follower's own trainer, idle this epoch: its weights decay as the trainer's do
    follower = DistroTrainer(follower_model, OPTIMIZER, SCHEDULE, micro_batch_size=2)
    followers = followers_on(follower_model, own)
    joined = {TRAINER: replay_class_of(own)} if same_class else {}
    followers.follow([TRAINER], start_step=0, joined_classes=joined)
    assert TRAINER not in followers.known  # nothing declared yet: its first epoch here
    verdicts = []
    for step, rows, tokens in step_batches(range(STEPS)):
        published = replay_and_train(followers, TRAINER, trainer, step, tokens, rows,
                                     trained_tokens=batch(tokens))
        if payload is not None:
            published = payload(published, trainer)
        checked = followers.verify(TRAINER, step, published)
        assert checked is not None
        verdicts.append(checked)
        follower.idle(step)
    return followers, verdicts


def test_an_honest_same_class_trainer_seen_first_is_judged_tightly_and_passes_exactly():
    followers, verdicts = first_epoch()
    assert [(c.verdict.ok, c.replayed, c.judged_loosely) for c in verdicts] == [
        (True, SAME_CLASS_REPLAY, 0)] * STEPS
    assert all(c.verdict.distances.jaccard == c.verdict.distances.hamming
               == c.verdict.distances.manhattan == 0.0 for c in verdicts)
    assert followers.judged_loosely == {}


def test_a_lazy_same_class_trainer_seen_first_fails_under_the_tight_limits():
    _, verdicts = first_epoch(batch=lazy_90)
    assert all(c.replayed == SAME_CLASS_REPLAY and c.judged_loosely == 0 for c in verdicts)
    assert not all(c.verdict.ok for c in verdicts), [c.verdict for c in verdicts]


def test_a_scaled_same_class_trainer_seen_first_fails_where_the_loose_limits_pass_it():
    _, verdicts = first_epoch(payload=scaled)
    assert all(c.replayed == SAME_CLASS_REPLAY for c in verdicts)
    assert not any(c.verdict.ok for c in verdicts), [c.verdict for c in verdicts]
    tight, loose = DECLARED_THRESHOLDS["fp32"], THRESHOLDS["fp32"]
    # the loose limits would have let every one of them through: the hole this closes
    assert all(d.jaccard <= loose.jaccard and d.hamming <= loose.hamming
               and d.manhattan <= loose.manhattan
               for d in (c.verdict.distances for c in verdicts))
    assert all(c.verdict.distances.manhattan > tight.manhattan for c in verdicts)


def test_a_same_class_trainer_declaring_another_micro_batch_fails_as_of_another_class():
    """Before the class covered the micro-batch size, this trainer was replayed in the
    follower's micro-batch and judged loosely as "not replayed in the declared settings"."""
    followers, verdicts = first_epoch(declared_micro_batch=1)
    assert [(c.verdict.ok, c.verdict.reason) for c in verdicts] == [(False, OTHER_CLASS)] * STEPS
    assert all(c.replayed.startswith("other class: ") for c in verdicts)
    # the same trainer followed by a follower of another class: judged loosely, as before
    followers, verdicts = first_epoch(declared_micro_batch=1, same_class=False)
    assert all(c.replayed.startswith("not replayed in the declared settings")
               for c in verdicts)
    assert followers.judged_loosely == {TRAINER: STEPS}
