"""Learning-rate schedules (docs/run-config.md, "Learning-rate schedules")."""

import pytest

from client_image.training.lr import cold_start_factor, scheduled_lr
from coordinator.config import ConstantLR, CosineLR, LinearLR, WarmupStableDecayLR


def test_constant_warms_up_linearly():
    s = ConstantLR(base_lr=1.0, warmup_init_lr=0.2, warmup_steps=4)
    assert [scheduled_lr(s, i) for i in range(6)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])


def test_linear_reaches_final_at_total_and_stays():
    s = LinearLR(base_lr=1.0, warmup_init_lr=0.0, final_lr=0.1, warmup_steps=2, total_steps=12)
    assert scheduled_lr(s, 1) == pytest.approx(0.5)
    assert scheduled_lr(s, 7) == pytest.approx(0.55)
    assert scheduled_lr(s, 12) == pytest.approx(0.1)
    assert scheduled_lr(s, 50) == pytest.approx(0.1)


def test_cosine_follows_half_a_cosine():
    s = CosineLR(base_lr=1.0, warmup_init_lr=0.0, final_lr=0.0, warmup_steps=0, total_steps=100)
    assert scheduled_lr(s, 0) == pytest.approx(1.0)
    assert scheduled_lr(s, 50) == pytest.approx(0.5)
    assert scheduled_lr(s, 25) == pytest.approx(0.5 * (1 + 2**-0.5))
    assert scheduled_lr(s, 100) == pytest.approx(0.0)
    assert scheduled_lr(s, 150) == pytest.approx(0.0)


def test_warmup_stable_decay_phases():
    s = WarmupStableDecayLR(
        base_lr=1.0, warmup_init_lr=0.0, cosine_decay_final_lr=0.5, linear_decay_final_lr=0.1,
        warmup_steps=2, stable_steps=3, cosine_decay_steps=4, linear_decay_steps=4,
    )
    lrs = [scheduled_lr(s, i) for i in range(16)]
    assert lrs[:5] == pytest.approx([0.0, 0.5, 1.0, 1.0, 1.0])
    assert lrs[5] == pytest.approx(1.0) and lrs[7] == pytest.approx(0.75)  # cosine midpoint
    assert lrs[9] == pytest.approx(0.5) and lrs[11] == pytest.approx(0.3)  # linear midpoint
    assert lrs[13:] == pytest.approx([0.1, 0.1, 0.1])


def test_cold_start_window():
    assert [cold_start_factor(s, 10, 5) for s in (9, 10, 11, 15, 16)] == pytest.approx(
        [1.0, 0.0, 0.2, 1.0, 1.0]
    )
    assert cold_start_factor(3, 0, 0) == 1.0
