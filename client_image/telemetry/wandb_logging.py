"""W&B logging of a client's training, as Psyche's client does (`--wandb-project` and co.).

    logger = start_wandb(config.observability, client, node_id, run_id)  # None: no W&B
    ...
    logger.finish()

One W&B run per client process: project `--wandb-project`, name `--wandb-run`, group
`--wandb-group`, entity `--wandb-entity` (the key comes from WANDB_API_KEY, or `wandb
login`; WANDB_MODE=offline writes the run under WANDB_DIR for a later `wandb sync`). Each
trained step logs, at the coordinator's step, Psyche's keys (shared/client/src/state/
stats.rs): `train/loss`, `train/perplexity`, `train/confidence`, `train/lr`,
`train/tokens_per_sec`, `train/global_token_batch_size`, `train/efficency` (Psyche's
spelling, so its W&B panels read ours), `coordinator/epoch` and `optim/grad_norm`; each
eval score logs `eval/<task>` (acc_norm where the task has it, else acc).

Without `--wandb-project` nothing here imports wandb (start_wandb returns before). A W&B
call that fails later is logged once and dropped: W&B never stops training.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from client_image.runtime.events import EvalScored, RuntimeEvent, Trained
from client_image.telemetry.training_stats import TrainingStats, model_vocab_size

if TYPE_CHECKING:
    from client_image.client_config import ObservabilityConfig
    from client_image.runtime.client import PsycheClient

log = logging.getLogger(__name__)
FINISH_WAIT_S = 10.0
INSTALL_HINT = "pip install 'psyche-py[wandb]' (or: pip install wandb)"


class WandbUnavailable(Exception):
    """W&B was asked for and cannot log: the package is missing or init failed (one line)."""


@dataclass(frozen=True)
class WandbTarget:
    project: str
    run: str | None = None
    group: str | None = None
    entity: str | None = None

    @classmethod
    def of(cls, observability: ObservabilityConfig) -> WandbTarget | None:
        """The W&B run the options name; None without --wandb-project (then no W&B at all)."""
        if not observability.wandb_project:
            return None
        return cls(observability.wandb_project, observability.wandb_run or None,
                   observability.wandb_group or None, observability.wandb_entity or None)


def step_log(event: Trained, stats: TrainingStats) -> dict[str, float]:
    """The values one trained step logs (non-finite or unknown ones are left out)."""
    values: dict[str, float | None] = {
        "train/loss": event.loss,
        "train/perplexity": math.exp(min(event.loss, 80.0)),
        "train/confidence": stats.confidence,
        "train/lr": event.learning_rate,
        "train/tokens_per_sec": event.tokens / event.seconds if event.seconds > 0 else None,
        "train/global_token_batch_size": float(event.batch_tokens) or None,
        "train/efficency": stats.efficiency,
        "coordinator/epoch": float(event.epoch),
        "optim/grad_norm": event.grad_norm,
    }
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}


class WandbLogger:
    """Logs a client's runtime events to one W&B run (`run`: what `wandb.init` returned)."""

    def __init__(self, run: Any, stats: TrainingStats):
        self.run = run
        self.stats = stats
        self.step = 0
        self._failed = False

    def on_event(self, event: RuntimeEvent) -> None:
        match event:
            case Trained():
                self.stats.on_trained(event)
                self._log(step_log(event, self.stats), event.step)
            case EvalScored(task=task):
                score = event.acc_norm if event.acc_norm is not None else event.acc
                # W&B refuses a step below the last one logged: an eval of an earlier
                # checkpoint is logged at the current step.
                self._log({f"eval/{task.lower()}": score}, event.step)
            case _:
                pass

    def _log(self, values: dict[str, float], step: int) -> None:
        self.step = max(self.step, step)
        try:
            self.run.log(values, step=self.step)
        except Exception as exc:
            if not self._failed:  # once: a broken W&B link must not flood the logs
                log.warning("W&B: logging failed, later failures are not logged: %s", exc)
            self._failed = True

    def finish(self, timeout_s: float = FINISH_WAIT_S) -> None:
        """Flush and close the run, waiting `timeout_s` at most: a stopping client must stop
        within seconds even when W&B's server is slow (what is left is W&B's to sync)."""
        def finish() -> None:
            try:
                self.run.finish()
            except Exception as exc:
                log.warning("W&B: finishing the run failed: %s", exc)

        finishing = threading.Thread(target=finish, name="wandb-finish", daemon=True)
        finishing.start()
        finishing.join(timeout_s)


def start_wandb(observability: ObservabilityConfig, client: PsycheClient, node_id: str,
                run_id: str) -> WandbLogger | None:
    """Start the W&B run the options name and follow the client's events; None without
    --wandb-project. Raises WandbUnavailable (a one-line reason) when it cannot start."""
    target = WandbTarget.of(observability)
    if target is None:
        return None
    try:
        import wandb
    except ImportError:
        raise WandbUnavailable(
            f"--wandb-project needs the wandb package, which is not installed: {INSTALL_HINT}"
        ) from None
    try:
        run = wandb.init(project=target.project, name=target.run, group=target.group,
                         entity=target.entity, config={"run_id": run_id, "node_id": node_id},
                         settings=wandb.Settings(silent=True, console="off"))
    except Exception as exc:  # no API key, unreachable server, bad entity: wandb's own errors
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WandbUnavailable(f"W&B run could not start: {first_line}") from None
    stats = TrainingStats(lambda: model_vocab_size(
        getattr(getattr(client, "worker", None), "model", None)))
    logger = WandbLogger(run, stats)
    client.events.listeners.append(logger.on_event)
    return logger
