"""Learning-rate schedules of the run config (docs/run-config.md,
"Learning-rate schedules"), evaluated at a step exactly as Psyche's
`LearningRateSchedule::get_lr` (shared/core/src/definitions.rs) does.

Every schedule first warms up linearly over w = warmup_steps:

    lr(s) = init + (base - init) * (s / w)                        for s < w

then
    Constant:  base
    Linear:    base + (final - base) * ((s - w) / (total - w))    for s < total, then final
    Cosine:    final + (base - final) * (1/2 * (1 + cos(pi * (s - w) / (total - w))))
               for every s >= w: past total_steps the cosine goes on (back up towards base
               and down again); Psyche does not clamp it, and runs rely on that.
    WSD:       base for stable_steps; cosine from base to cosine_final over cosine_decay_steps;
               linear from cosine_final to linear_final over linear_decay_steps; then constant.

The operations are grouped as in the Rust source so that every value is the same double
(tests/training/psyche_lr_vectors.json holds values computed by the Rust code).

Cold start (after a pause; docs/distro.md, "Learning rate and cold start"): inside
[start, start + cold_start_warmup_steps] the schedule is multiplied by
f = (s - start) / cold_start_warmup_steps.
"""

from __future__ import annotations

import math

from coordinator.config import ConstantLR, CosineLR, LinearLR, LRSchedule, WarmupStableDecayLR

_U32_MAX = 2**32 - 1


def scheduled_lr(schedule: LRSchedule, step: int) -> float:
    """lr(step) for one of the run config's schedules (a step is a u32, as in Psyche)."""
    if not 0 <= step <= _U32_MAX:
        raise ValueError(f"step must be in 0..2^32-1, got {step}")
    if isinstance(schedule, WarmupStableDecayLR):
        # Psyche asserts these on every call, warm-up included: a run whose schedule breaks
        # them panics every Psyche client, so it must not train here either.
        _check_wsd(schedule)
    if step < schedule.warmup_steps:
        init = schedule.warmup_init_lr
        return init + (schedule.base_lr - init) * (step / schedule.warmup_steps)
    if isinstance(schedule, ConstantLR):
        return schedule.base_lr
    if isinstance(schedule, CosineLR):  # before LinearLR: CosineLR subclasses it
        progress = (step - schedule.warmup_steps) / (schedule.total_steps - schedule.warmup_steps)
        cosine_decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return schedule.final_lr + (schedule.base_lr - schedule.final_lr) * cosine_decay
    if isinstance(schedule, LinearLR):
        if step >= schedule.total_steps:
            return schedule.final_lr
        progress = (step - schedule.warmup_steps) / (schedule.total_steps - schedule.warmup_steps)
        return schedule.base_lr + (schedule.final_lr - schedule.base_lr) * progress
    if isinstance(schedule, WarmupStableDecayLR):
        return _wsd(schedule, step)
    raise TypeError(f"unknown learning-rate schedule {type(schedule).__name__}")


def _check_wsd(schedule: WarmupStableDecayLR) -> None:
    if not schedule.cosine_decay_final_lr <= schedule.base_lr:
        raise ValueError(
            "WarmupStableDecay needs cosine_decay_final_lr <= base_lr "
            f"({schedule.cosine_decay_final_lr} > {schedule.base_lr})"
        )
    if not schedule.linear_decay_final_lr <= schedule.cosine_decay_final_lr:
        raise ValueError(
            "WarmupStableDecay needs linear_decay_final_lr <= cosine_decay_final_lr "
            f"({schedule.linear_decay_final_lr} > {schedule.cosine_decay_final_lr})"
        )


def _wsd(schedule: WarmupStableDecayLR, step: int) -> float:
    """The phases after warm-up; step >= warmup_steps."""
    stable_end = schedule.warmup_steps + schedule.stable_steps
    cosine_end = stable_end + schedule.cosine_decay_steps
    linear_end = cosine_end + schedule.linear_decay_steps
    base, cosine_final = schedule.base_lr, schedule.cosine_decay_final_lr
    if step < stable_end:
        return base
    if step < cosine_end:
        progress = (step - stable_end) / schedule.cosine_decay_steps
        cosine_decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return cosine_final + (base - cosine_final) * cosine_decay
    if step < linear_end:
        fraction = (step - cosine_end) / schedule.linear_decay_steps
        return cosine_final - (cosine_final - schedule.linear_decay_final_lr) * fraction
    return schedule.linear_decay_final_lr


def cold_start_factor(step: int, start_step: int, cold_start_warmup_steps: int) -> float:
    """f = (s - start) / cold_start_warmup_steps inside the cold-start window, else 1."""
    if cold_start_warmup_steps <= 0:
        return 1.0
    if start_step <= step <= start_step + cold_start_warmup_steps:
        return (step - start_step) / cold_start_warmup_steps
    return 1.0
