"""The setup the follower tests share: real DisTrO trainers on the tiny model, real
Followers replaying them on one follower model, and the batches of each step."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.formats.replay_settings import ReplaySettings
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer
from client_image.verification.followers import Checked, Followers
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider


def follower_test_optimizer(one_bit: bool = False) -> DistroOptimizer:
    """The DisTrO optimizer of the follower tests (top 8 of chunks of 64), its results sent
    as 1-bit signs if `one_bit`."""
    return DistroOptimizer(compression_decay=0.999, compression_topk=8, compression_chunk=64,
                           quantize_1bit=one_bit, clip_grad_norm=1.0, weight_decay=0.1)


OPTIMIZER = follower_test_optimizer()
SCHEDULE = ConstantLR(base_lr=1e-3, warmup_init_lr=1e-4, warmup_steps=2)


def tiny_model() -> torch.nn.Module:
    """A fresh copy of the bundled tiny model, on the CPU."""
    return load_causal_lm(TINY_MODEL, device="cpu")


def declaring_trainers(declared: Mapping[bytes, ReplaySettings | None]
                       ) -> dict[bytes, DistroTrainer]:
    """One trainer per key, each on its own fresh tiny model with micro-batch 2, declaring
    that key's settings (None: declaring nothing); in `declared`'s order."""
    return {key: DistroTrainer(tiny_model(), OPTIMIZER, SCHEDULE, micro_batch_size=2,
                               declared=settings)
            for key, settings in declared.items()}


def followers_on(model: torch.nn.Module, own: ReplaySettings,
                 optimizer: DistroOptimizer = OPTIMIZER,
                 known: dict[bytes, ReplaySettings] | None = None) -> Followers:
    """Followers of a client with settings `own` whose shadows replay on `model` (the
    follower's own) in each trainer's micro-batch and declared settings."""
    return Followers(lambda start, settings: DistroTrainer(
        model, optimizer, SCHEDULE, micro_batch_size=settings.micro_batch, start_step=start,
        declared=settings), own, known=known)


def step_batches(steps: range) -> Iterator[tuple[int, tuple[int, int], torch.Tensor]]:
    """Each step of `steps` with its batch: rows 4 * step and 4 * step + 1 of TRAIN_DATA
    (sequences of 32 tokens) and their tokens."""
    data = LocalDataProvider(TRAIN_DATA, 32)
    for step in steps:
        rows = (4 * step, 4 * step + 1)
        yield step, rows, data.get_samples(*rows)


def replay_and_train(followers: Followers, key: bytes, trainer: DistroTrainer, step: int,
                     tokens: torch.Tensor, rows: tuple[int, int],
                     trained_tokens: torch.Tensor | None = None) -> bytes:
    """The follower replays trainer `key`'s step on `tokens`, then `trainer` trains it, on
    `trained_tokens` if given (a cheating trainer's) else on `tokens`: the payload it
    publishes (asserted to be there)."""
    followers.replay(key, step, tokens, rows, cold_start=False)
    payload = trainer.train(step, tokens if trained_tokens is None else trained_tokens,
                            batch_id=rows).payload
    assert payload is not None
    return payload


def verify_each(followers: Followers, trainers: Mapping[bytes, DistroTrainer], step: int,
                tokens: torch.Tensor, rows: tuple[int, int]) -> dict[bytes, Checked]:
    """Per trainer in `trainers`' order: the follower replays its step, it trains, and the
    follower verifies its payload; each one's check (asserted to be there)."""
    checks = {}
    for key, trainer in trainers.items():
        checked = followers.verify(key, step, replay_and_train(followers, key, trainer, step,
                                                               tokens, rows))
        assert checked is not None
        checks[key] = checked
    return checks
