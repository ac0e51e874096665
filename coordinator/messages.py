"""What a client tells the coordinator, and the coordinator's refusal: domain messages.

The client's runtime speaks these to its backend's typed port
(`client_image.backends.base.CoordinatorBackend`); each backend encodes its own wire (the
TCP protocol's pydantic messages, the Solana program's instructions) and the coordinator
takes the same values back (`Coordinator.witness`, `.health_check`, ...). Psyche does the
same: these are its coordinator crate's types, and its `Backend` trait
(`shared/watcher/src/traits.rs`) sends them.

    RoundWitness(witness, metadata)       an elected witness's report of a training round
    WarmupWitness(witness)                a client has loaded the model (warm-up)
    HealthCheck(checks)                   trainers whose results the witnesses missed
    CheckpointReport(index, repo)         where this client uploaded the epoch's checkpoint
    VerificationReport (coordinator.state) a follower's replay did not reproduce a result
    Withdrawal()                          a client leaves the run
    Refusal(error, detail)                the coordinator (or chain) refused a message

A withdrawal carries nothing: the client's port is `withdraw()`, and `Withdrawal` is what
a server decodes its wire message to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coordinator.committee import CommitteeProof
from coordinator.config_variants import GcsCheckpoint, HubCheckpoint
from coordinator.state import NodeIdentity, Witness

MAX_WITNESS_EVALS = 8  # Psyche's FixedVec of eval results in the witness metadata
MAX_EVAL_NAME_BYTES = 32  # Psyche's WitnessEvalResult name


@dataclass(frozen=True, slots=True)
class EvalScore:
    """One eval score in a witness's metadata (Psyche's WitnessEvalResult)."""

    name: str
    value: float


def witness_eval_scores(scores: Mapping[str, Mapping[str, float]]) -> tuple[EvalScore, ...]:
    """The first MAX_WITNESS_EVALS tasks of `scores` (task -> metric -> value, as the
    client's counters keep them), by name: acc_norm where the task has it, else acc (the
    metric Psyche reports per task); a name is cut to its first 32 bytes."""
    picked = []
    for task in sorted(scores)[:MAX_WITNESS_EVALS]:
        metrics = scores[task]
        value = metrics.get("acc_norm", metrics.get("acc"))
        if value is not None:
            name = task.encode()[:MAX_EVAL_NAME_BYTES].decode(errors="ignore")
            picked.append(EvalScore(name=name, value=float(value)))
    return tuple(picked)


@dataclass(frozen=True, slots=True)
class WitnessMetadata:
    """Carried for observability (Psyche ignores it on-chain too): the step the witness
    was made for, the witness's last loss and speed, and its latest eval scores."""

    step: int = 0
    loss: float | None = None
    tokens_per_sec: float = 0.0
    bandwidth_per_sec: float = 0.0
    evals: tuple[EvalScore, ...] = ()


@dataclass(frozen=True, slots=True)
class RoundWitness:
    """An elected witness's report of the round of `metadata.step` (Psyche's
    OpportunisticData::WitnessStep)."""

    witness: Witness
    metadata: WitnessMetadata = WitnessMetadata()


@dataclass(frozen=True, slots=True)
class WarmupWitness:
    """This client has loaded the model; W of them start the first round early (Psyche's
    OpportunisticData::WarmupStep)."""

    witness: Witness


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """Trainers (with their committee proofs) whose results the witnesses did not
    confirm (Psyche's HealthChecks)."""

    checks: tuple[tuple[NodeIdentity, CommitteeProof], ...]


@dataclass(frozen=True, slots=True)
class CheckpointReport:
    """This client (at `index` in the epoch's clients) uploaded the run's checkpoint to
    `repo` (Psyche's Checkpoint::Hub / Checkpoint::Gcs)."""

    index: int
    repo: HubCheckpoint | GcsCheckpoint


@dataclass(frozen=True, slots=True)
class Withdrawal:
    """This client leaves the run (Psyche's withdraw): it is taken off the epoch's list."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """The coordinator refused one of this client's messages: the error's name (a
    `CoordinatorError`, a server's or a program's word) and what it says."""

    error: str
    detail: str = ""


__all__ = [
    "MAX_WITNESS_EVALS", "CheckpointReport", "EvalScore", "HealthCheck", "Refusal",
    "RoundWitness", "WarmupWitness", "Withdrawal", "WitnessMetadata", "witness_eval_scores",
]
