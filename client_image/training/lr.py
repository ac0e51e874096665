"""Learning-rate schedules of the run config (docs/run-config.md,
"Learning-rate schedules"), evaluated at a step.

Every schedule first warms up linearly over w = warmup_steps:

    lr(s) = init + (base - init) * s / w                          for s < w

then
    Constant:  base
    Linear:    base + (final - base) * (s - w) / (total - w)      until total, then final
    Cosine:    final + (base - final) * 1/2 * (1 + cos(pi * (s - w) / (total - w)))
    WSD:       base for stable_steps; cosine from base to cosine_final over cosine_decay_steps;
               linear from cosine_final to linear_final over linear_decay_steps; then constant.

Cold start (after a pause; docs/distro.md, "Learning rate and cold start"): inside
[start, start + cold_start_warmup_steps] the schedule is multiplied by
f = (s - start) / cold_start_warmup_steps.
"""

from __future__ import annotations

import math

from coordinator.config import ConstantLR, CosineLR, LinearLR, LRSchedule, WarmupStableDecayLR


def scheduled_lr(schedule: LRSchedule, step: int) -> float:
    """lr(step) for one of the run config's schedules."""
    if step < schedule.warmup_steps:
        return schedule.warmup_init_lr + (
            (schedule.base_lr - schedule.warmup_init_lr) * step / schedule.warmup_steps
        )
    since_warmup = step - schedule.warmup_steps
    if isinstance(schedule, ConstantLR):
        return schedule.base_lr
    if isinstance(schedule, CosineLR):  # before LinearLR: CosineLR subclasses it
        span = schedule.total_steps - schedule.warmup_steps
        progress = min(since_warmup / span, 1.0)
        return schedule.final_lr + (schedule.base_lr - schedule.final_lr) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )
    if isinstance(schedule, LinearLR):
        span = schedule.total_steps - schedule.warmup_steps
        progress = min(since_warmup / span, 1.0)
        return schedule.base_lr + (schedule.final_lr - schedule.base_lr) * progress
    if isinstance(schedule, WarmupStableDecayLR):
        return _wsd(schedule, since_warmup)
    raise TypeError(f"unknown learning-rate schedule {type(schedule).__name__}")


def _wsd(schedule: WarmupStableDecayLR, since_warmup: int) -> float:
    s = since_warmup - schedule.stable_steps
    if s < 0:
        return schedule.base_lr
    if s < schedule.cosine_decay_steps:
        cosine = 0.5 * (1 + math.cos(math.pi * s / schedule.cosine_decay_steps))
        return schedule.cosine_decay_final_lr + (
            (schedule.base_lr - schedule.cosine_decay_final_lr) * cosine
        )
    s -= schedule.cosine_decay_steps
    if s < schedule.linear_decay_steps:
        fraction = s / schedule.linear_decay_steps
        return schedule.cosine_decay_final_lr + fraction * (
            schedule.linear_decay_final_lr - schedule.cosine_decay_final_lr
        )
    return schedule.linear_decay_final_lr


def cold_start_factor(step: int, start_step: int, cold_start_warmup_steps: int) -> float:
    """f = (s - start) / cold_start_warmup_steps inside the cold-start window, else 1."""
    if cold_start_warmup_steps <= 0:
        return 1.0
    if start_step <= step <= start_step + cold_start_warmup_steps:
        return (step - start_step) / cold_start_warmup_steps
    return 1.0
