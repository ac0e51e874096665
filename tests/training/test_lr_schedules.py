"""Learning-rate schedules (docs/run-config.md, "Learning-rate schedules")."""

import json
import math
from pathlib import Path

import pytest

from client_image.training.lr import cold_start_factor, scheduled_lr
from coordinator.config import ConstantLR, CosineLR, LinearLR, WarmupStableDecayLR

# Values of Psyche's LearningRateSchedule::get_lr, computed by the Rust code; see its "_note".
VECTORS = json.loads((Path(__file__).parent / "psyche_lr_vectors.json").read_text())["schedules"]
KINDS = {
    "Constant": ConstantLR, "Linear": LinearLR, "Cosine": CosineLR,
    "WarmupStableDecay": WarmupStableDecayLR,
}


def _schedule(name):
    ((kind, fields),) = VECTORS[name]["schedule"].items()
    return KINDS[kind](**fields)


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
    # Past total_steps Psyche keeps following the cosine: back up to base at 2 * total.
    assert scheduled_lr(s, 150) == pytest.approx(0.5)
    assert scheduled_lr(s, 200) == pytest.approx(1.0)


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


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_every_step_matches_psyche_bit_for_bit(name):
    # Exact equality: the Rust operations are grouped the same way, so each value is the same
    # double. The cosine goes through the C library's cos (glibc here, as for Psyche's Linux
    # clients); a libm that rounds cos differently could move those values by an ulp.
    schedule = _schedule(name)
    got = [[step, scheduled_lr(schedule, step)] for step, _ in VECTORS[name]["values"]]
    assert got == VECTORS[name]["values"]


def test_vectors_cover_every_schedule_kind_past_its_end():
    kinds = {next(iter(VECTORS[name]["schedule"])) for name in VECTORS}
    assert kinds == set(KINDS)
    for name in VECTORS:
        assert VECTORS[name]["values"][-1][0] >= 2 * max(
            v for k, v in next(iter(VECTORS[name]["schedule"].values())).items()
            if k.endswith("_steps")
        )


def test_llama2_20m_dev_cosine_keeps_going_after_its_2000_steps():
    # consilience-match-llama2-20m-fineweb-pretrain-dev: LR total 2000 in a 25 000-step run.
    s = CosineLR(base_lr=4e-4, warmup_init_lr=0.0, final_lr=4e-5, warmup_steps=20, total_steps=2000)
    assert scheduled_lr(s, 2000) == 4e-5
    assert scheduled_lr(s, 12_500) == pytest.approx(3.2441e-4, rel=1e-4)
    expected = 4e-5 + 3.6e-4 * 0.5 * (1 + math.cos(math.pi * 12_480 / 1980))
    assert scheduled_lr(s, 12_500) == pytest.approx(expected, rel=1e-12)


def test_linear_is_exactly_final_lr_from_total_steps_on():
    s = LinearLR(base_lr=3e-4, warmup_init_lr=0.0, final_lr=3e-5, warmup_steps=7, total_steps=50)
    assert [scheduled_lr(s, step) for step in (50, 51, 2**32 - 1)] == [3e-5] * 3


def test_warmup_stable_decay_rejects_rising_finals_like_psyches_assert():
    rising = WarmupStableDecayLR(
        base_lr=1.0, warmup_init_lr=0.0, cosine_decay_final_lr=0.5, linear_decay_final_lr=0.6,
        warmup_steps=2, stable_steps=3, cosine_decay_steps=4, linear_decay_steps=4,
    )
    with pytest.raises(ValueError, match="linear_decay_final_lr"):
        scheduled_lr(rising, 0)
    above_base = rising.model_copy(update={"cosine_decay_final_lr": 2.0, "linear_decay_final_lr": 0.1})
    with pytest.raises(ValueError, match="cosine_decay_final_lr"):
        scheduled_lr(above_base, 0)


def test_step_is_a_u32():
    s = ConstantLR(base_lr=1.0, warmup_init_lr=0.0, warmup_steps=0)
    assert scheduled_lr(s, 2**32 - 1) == 1.0
    for step in (-1, 2**32):
        with pytest.raises(ValueError, match="step"):
            scheduled_lr(s, step)
