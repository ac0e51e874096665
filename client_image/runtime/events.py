"""What the client runtime reports, as typed messages.

Every event is a frozen dataclass; observers (the event log, telemetry, the client's TUI)
match them by type, never by text. `NAME` is the stable name a `--logs json` line carries
in its `"event"` field (`{"event": "trained", "step": 3, ...}`), which the local testnet
and the e2e tests read; `fields()` gives the rest of the line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from psyche_common.metrics_schema import RemovalReason


@dataclass(frozen=True)
class RuntimeEvent:
    NAME: ClassVar[str] = "event"

    def fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# ------------------------------------------------------------------ lifecycle
@dataclass(frozen=True)
class Started(RuntimeEvent):
    NAME: ClassVar[str] = "started"
    identity: str
    p2p_address: str


@dataclass(frozen=True)
class StateChanged(RuntimeEvent):
    """The coordinator's phase, epoch or step changed."""

    NAME: ClassVar[str] = "state"
    phase: str
    epoch: int
    step: int
    clients: int


@dataclass(frozen=True)
class VersionMismatch(RuntimeEvent):
    NAME: ClassVar[str] = "version_mismatch"
    wanted: str
    running: str


@dataclass(frozen=True)
class CoordinatorRefused(RuntimeEvent):
    """The coordinator refused one of our messages (not fatal)."""

    NAME: ClassVar[str] = "coordinator_error"
    error: str
    detail: str


@dataclass(frozen=True)
class TaskFailed(RuntimeEvent):
    """A runtime task raised: the client desyncs and rejoins at the next epoch."""

    NAME: ClassVar[str] = "error"
    task: str
    error: str
    error_type: str


@dataclass(frozen=True)
class Desynced(RuntimeEvent):
    NAME: ClassVar[str] = "desync"
    reason: str


@dataclass(frozen=True)
class RunFinished(RuntimeEvent):
    NAME: ClassVar[str] = "finished"
    step: int


# ------------------------------------------------------------------ warm-up
@dataclass(frozen=True)
class ModelLoaded(RuntimeEvent):
    NAME: ClassVar[str] = "model_loaded"
    source: str  # "p2p" | "hub" | "gcs" | "dummy" | "local" (own checkpoint of the last cooldown)
    seconds: float
    peers: int = 0
    bytes: int = 0
    repo: str = ""
    detail: str = ""  # "local": why no peer could serve it; "gcs": step{N} of the manifest


@dataclass(frozen=True)
class Ready(RuntimeEvent):
    NAME: ClassVar[str] = "ready"
    epoch: int


@dataclass(frozen=True)
class WarmupWitnessSent(RuntimeEvent):
    NAME: ClassVar[str] = "warmup_witness"
    epoch: int


# ------------------------------------------------------------------ rounds
@dataclass(frozen=True)
class Trained(RuntimeEvent):
    NAME: ClassVar[str] = "trained"
    step: int
    epoch: int
    loss: float
    batch: tuple[int, int]
    payload_bytes: int
    seconds: float
    tokens: int
    ranks: int = 1  # processes that trained this client's share (D x T)
    # How long training waited for the batch after the round's start work (runtime/prefetch.py)
    data_wait_s: float = 0.0
    learning_rate: float = 0.0  # the schedule's lr of this step
    grad_norm: float = 0.0  # the gradient's total L2 norm before clipping
    batch_tokens: int = 0  # tokens in the step's global batch (all trainers' sequences)


@dataclass(frozen=True)
class Applied(RuntimeEvent):
    NAME: ClassVar[str] = "applied"
    step: int
    of_step: int
    results: int
    skipped: int
    left_out: int = 0  # consensus results every client leaves out (verification/checks.py)


@dataclass(frozen=True)
class ResultLeftOut(RuntimeEvent):
    """A consensus result that failed a cheap check: no client applies it."""

    NAME: ClassVar[str] = "result_left_out"
    of_step: int
    trainer: str  # node id, hex
    check: str  # empty | not_empty | underfilled | copy | repeat | undecodable
    detail: str


@dataclass(frozen=True)
class Following(RuntimeEvent):
    """The trainers this client follows (replays) this epoch (coordinator/verification.py)."""

    NAME: ClassVar[str] = "following"
    epoch: int
    trainers: tuple[str, ...]  # node ids, hex
    able: bool = True  # False: this client cannot replay (a model split over ranks)


@dataclass(frozen=True)
class ResultVerified(RuntimeEvent):
    """A followed trainer's consensus result against this client's replay of it."""

    NAME: ClassVar[str] = "result_verified"
    of_step: int
    trainer: str
    ok: bool
    jaccard: float
    hamming: float
    manhattan: float
    reason: str
    # "declared": replayed in the trainer's declared settings (tight limits); else why not
    replayed: str = ""
    # this trainer's results this client judged with the loose limits this epoch, this one
    # included: a trainer whose declaration no follower can reproduce counts up every step
    judged_loosely: int = 0


@dataclass(frozen=True)
class VerificationReportSent(RuntimeEvent):
    NAME: ClassVar[str] = "verification_report"
    of_step: int
    accused: str
    reason: str


@dataclass(frozen=True)
class Ejected(RuntimeEvent):
    """The coordinator ejected this client: its followers reported its results."""

    NAME: ClassVar[str] = "ejected"
    epoch: int
    reporters: tuple[str, ...]


@dataclass(frozen=True)
class Removed(RuntimeEvent):
    """The coordinator took this client out of the epoch; `reason` is inferred by the
    client (runtime/removal.py): late-witness, training-over-time, health-check, paused,
    withdrawn."""

    NAME: ClassVar[str] = "removed"
    epoch: int
    step: int
    reason: RemovalReason
    detail: str


@dataclass(frozen=True)
class DownloadFailed(RuntimeEvent):
    NAME: ClassVar[str] = "download_failed"
    step: int
    batch: tuple[int, int]
    error: str


@dataclass(frozen=True)
class BadResult(RuntimeEvent):
    """A peer's result that does not match its commitment or does not decode."""

    NAME: ClassVar[str] = "bad_result"
    step: int
    batch: tuple[int, int]
    reason: str


@dataclass(frozen=True)
class WitnessSent(RuntimeEvent):
    NAME: ClassVar[str] = "witness"
    step: int
    vouched: int


@dataclass(frozen=True)
class HealthCheckSent(RuntimeEvent):
    NAME: ClassVar[str] = "health_check"
    step: int
    unhealthy: tuple[str, ...]


# ------------------------------------------------------------------ cooldown
@dataclass(frozen=True)
class Checkpointed(RuntimeEvent):
    NAME: ClassVar[str] = "checkpoint"
    step: int
    epoch: int
    path: str


@dataclass(frozen=True)
class CheckpointFailed(RuntimeEvent):
    """Warning: the cooldown's checkpoint could not be written under `directory` (disk
    full, a directory that went away). Only the local copy is lost: the model is still
    shared from memory with the next epoch's joiners, and nothing is uploaded."""

    NAME: ClassVar[str] = "checkpoint_failed"
    step: int
    epoch: int
    directory: str
    error: str


@dataclass(frozen=True)
class Uploaded(RuntimeEvent):
    NAME: ClassVar[str] = "uploaded"
    step: int
    repo: str
    revision: str


@dataclass(frozen=True)
class UploadFailed(RuntimeEvent):
    NAME: ClassVar[str] = "upload_failed"
    step: int
    repo: str
    error: str


@dataclass(frozen=True)
class CheckpointNotReported(RuntimeEvent):
    """Warning: the upload went to a repository that is not the run's, so the coordinator
    would refuse the report (`error`); it is not sent (the upload itself is kept)."""

    NAME: ClassVar[str] = "checkpoint_not_reported"
    step: int
    repo: str
    error: str
    detail: str


@dataclass(frozen=True)
class HubRepoNotRunRepository(RuntimeEvent):
    """Warning, once at start: `--hub-repo` is not the run's checkpoint repository (set by
    its authority), so the coordinator will refuse this client's checkpoint reports."""

    NAME: ClassVar[str] = "hub_repo_not_run_repository"
    hub_repo: str
    run_checkpoint: str
    error: str
    detail: str


# ------------------------------------------------------------------ evals (runtime/evaluating.py)
@dataclass(frozen=True)
class EvalScored(RuntimeEvent):
    """One task's score of the model checkpointed at `step` (the mean over `docs`)."""

    NAME: ClassVar[str] = "eval"
    task: str
    epoch: int
    step: int
    docs: int
    acc: float
    acc_norm: float | None  # None: Psyche reports acc only for this task (boolq, mmlu)
    source: str  # where the documents came from: a file, a hub snapshot, the bundled sample
    seconds: float

    def metrics(self) -> dict[str, float]:
        return {"acc": self.acc} | ({} if self.acc_norm is None else {"acc_norm": self.acc_norm})


@dataclass(frozen=True)
class PromptSampled(RuntimeEvent):
    """--prompt-task: the model's greedy continuation of a fixed prompt, once per epoch."""

    NAME: ClassVar[str] = "prompt"
    epoch: int
    step: int
    prompt: str
    completion: str


@dataclass(frozen=True)
class EvalsInterrupted(RuntimeEvent):
    """A warm-up or round needed the model: the evals stopped between two documents."""

    NAME: ClassVar[str] = "evals_interrupted"
    epoch: int
    reason: str


@dataclass(frozen=True)
class EvalFailed(RuntimeEvent):
    """A task could not run (its data, the tokenizer); training is not affected."""

    NAME: ClassVar[str] = "eval_failed"
    task: str  # "*": all of them
    error: str
