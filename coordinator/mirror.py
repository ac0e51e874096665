"""Client-side mirror of the run (reference §1.5): which step a client is in.

    Warmup   (valid while WaitingForMembers / Warmup / Paused)
      -> Training (RoundTrain) -> Witness (RoundWitness) -> Training ... -> Cooldown -> Warmup
Anything else is a desync: the client missed states and must resynchronise.
"""

from __future__ import annotations

from enum import Enum

from coordinator.limits import RunState
from coordinator.state import CoordinatorState, NodeIdentity


class ActiveStep(Enum):
    Warmup = "Warmup"
    Training = "Training"
    Witness = "Witness"
    Cooldown = "Cooldown"


class Desync(Exception):
    """Not raised by the coordinator; returned by `next_active_step` as a value."""


_WAITING = (RunState.WaitingForMembers, RunState.Warmup, RunState.Paused)
_NEXT: dict[tuple[ActiveStep, RunState], ActiveStep] = {
    (ActiveStep.Warmup, RunState.RoundTrain): ActiveStep.Training,
    (ActiveStep.Training, RunState.RoundTrain): ActiveStep.Training,
    (ActiveStep.Training, RunState.RoundWitness): ActiveStep.Witness,
    (ActiveStep.Witness, RunState.RoundWitness): ActiveStep.Witness,
    (ActiveStep.Witness, RunState.RoundTrain): ActiveStep.Training,
    (ActiveStep.Witness, RunState.Cooldown): ActiveStep.Cooldown,
    (ActiveStep.Cooldown, RunState.Cooldown): ActiveStep.Cooldown,
}


def next_active_step(current: ActiveStep, run_state: RunState) -> ActiveStep | Desync:
    if run_state in _WAITING and current in (ActiveStep.Warmup, ActiveStep.Cooldown):
        return ActiveStep.Warmup
    step = _NEXT.get((current, run_state))
    if step is None:
        return Desync(f"{current.value} cannot follow into {run_state.name}")
    return step


def should_load_model(state: CoordinatorState, me: NodeIdentity) -> bool:
    """Load the model only on seeing Warmup while listed in the epoch's clients."""
    return state.run_state is RunState.Warmup and state.index_of(me) is not None
