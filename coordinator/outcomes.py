"""What tick and events return: results and rejections are values, never exceptions.

A backend sends `Rejected` back to the client (error name + detail) and keeps running;
a rejected call has left the state untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class TickResult(Enum):
    Ticked = "Ticked"
    EpochEndSuccess = "EpochEnd(true)"  # Cooldown finished: a checkpointed epoch
    EpochEndFailure = "EpochEnd(false)"  # Warmup lost too many clients


class CoordinatorError(Enum):
    Halted = "the run is Uninitialized, Paused or Finished"
    WrongRunState = "not allowed in the current run state"
    InvalidClientIndex = "no such client index"
    NotYourIndex = "the index does not belong to the sender"
    NotAClient = "the sender is not a client of this epoch"
    InvalidWitnessProof = "the witness proof does not verify for this round"
    DuplicateWitness = "this client already witnessed the round"
    WitnessesFull = "the round already has all its witnesses"
    HealthCheckTooEarly = "health checks need round height >= 2"
    InvalidHealthCheck = "a listed client is healthy or its proof does not verify"
    InvalidWithdraw = "the client is not Healthy"
    CannotResume = "only a Paused or Uninitialized run can resume"
    InvalidCheckpoint = "a checkpoint report must be a Hub or Gcs repository"
    # Appended last: psyche_solana/errors.py numbers the program's errors in this order.
    CheckpointNotRunRepository = ("a checkpoint report must name a commit of the run's own "
                                  "repository (set by its authority)")
    InvalidVerificationReport = ("a verification report must come from one of the trainer's "
                                 "followers, once, about a step of this epoch")


@dataclass(frozen=True, slots=True)
class Rejected:
    error: CoordinatorError
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.error.name}: {self.detail or self.error.value}"
