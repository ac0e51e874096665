"""What an operator sees of a run, as plain text: the run snapshot, the client's metrics
and its loss history, and the `describe_*` lines the panels and `--no-tui` logs show.

No Textual here: `--no-tui` must not import it. The panels are in this package too
(`run_panel`, `witness_panel`, `training_panel`), shared by the run-manager's TUI and the
client's own `--logs tui`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from psyche_common.metrics_schema import ClientMetrics
from psyche_common.run_view import RunSnapshot

LOSS_HISTORY_POINTS = 2000


@dataclass
class RunView:
    run: RunSnapshot | None = None
    metrics: ClientMetrics | None = None
    metrics_error: str = ""
    losses: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=LOSS_HISTORY_POINTS))

    def apply_metrics(self, metrics: ClientMetrics) -> None:
        self.metrics = metrics
        self.metrics_error = ""
        # One loss point per step: the endpoint is polled faster than steps advance.
        if metrics.loss is not None and (not self.losses or self.losses[-1][0] != metrics.step):
            self.losses.append((metrics.step, metrics.loss))

    def apply_run(self, snapshot: RunSnapshot | None) -> None:
        self.run = snapshot

    def client_label(self, client_id: str) -> str:
        """How the client list names a client (a program may add what it knows of it)."""
        return short_id(client_id)


def short_id(identity: str) -> str:
    """A key short enough for a table cell: its first and last six characters."""
    return identity if len(identity) <= 16 else f"{identity[:6]}…{identity[-6:]}"


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"  # unreachable; keeps mypy sure of the return


def describe_wait(phase: str, *, init_min_clients: int, joined: int | None = None,
                  warmup_ready: int = 0, warmup_target: int = 0,
                  class_shortfalls: Sequence[int] = ()) -> str | None:
    """What the run waits for, in words; None while it trains (the witness line says how
    the round is going). One wording for every TUI and `--no-tui`.

    WaitingForMembers  "waiting for N clients, M connected" (N = init_min_clients, M the
                       clients asking to take part; left out where unknown), then for
                       the joiners a verified epoch cannot list yet (`class_shortfalls`:
                       how many more clients of its replay class each waits for,
                       coordinator/verification.py) "; 1 waiting for 2 more clients of
                       its replay class"
    Warmup             "warming up: K of W ready" (K warm-up witnesses of the W that start
                       the first round early)
    Uninitialized, Paused, Finished: said plainly.
    """
    if phase == "WaitingForMembers":
        line = f"waiting for {_plural(init_min_clients, 'client')}"
        if joined is None:
            return line
        line += f", {joined} connected"
        # Enough of them: the warm-up starts at the next tick (after the extra wait time).
        eligible = joined - len(class_shortfalls)
        line += ": starting" if eligible >= init_min_clients else ""
        counts = Counter(class_shortfalls)
        for short in sorted(counts, reverse=True):
            count = counts[short]
            line += (f"; {count} waiting for {_plural(short, 'more client')} of "
                     f"{'its' if count == 1 else 'their'} replay class")
        return line
    if phase == "Warmup":
        return f"warming up: {warmup_ready} of {warmup_target} ready"
    if phase == "Uninitialized":
        return "not started: the run has no config and model yet"
    if phase == "Paused":
        return "paused: nothing trains until the run is resumed"
    if phase == "Finished":
        return "finished: the run is over"
    return None


def describe_model_resets(resets: int) -> str | None:
    """The run's model resets (CoordinatorState.model_resets) in words; None while none."""
    if not resets:
        return None
    return (f"MODEL RESET {resets} time{'' if resets == 1 else 's'}: an epoch went back to "
            "the stored checkpoint, no client holding the newer model came back")


MODEL_LOST = ("MODEL LOST: no client holding the run's newer model is back and no upload "
              "as new was reported; waiting for a holder, or for the run's authority to "
              "accept the loss (psyche-coordinator run --accept-model-loss; on Solana the "
              "accept_model_loss instruction)")


def describe_model_lost(lost: bool) -> str | None:
    """The run waits for a holder of its model (CoordinatorState.model_lost); None while
    not."""
    return MODEL_LOST if lost else None


def describe_run(run: RunSnapshot | None) -> list[str]:
    if run is None:
        return ["run: no coordinator data"]
    timer = format_duration(run.phase_elapsed_s)
    if run.phase_timeout_s is not None:
        timer += f" / {format_duration(run.phase_timeout_s)}"
    healthy = sum(1 for c in run.clients if c.state == "Healthy")
    lines = [
        f"run {run.run_id}: {run.phase} {timer}",
        f"epoch {run.epoch}  step {run.step}  clients {healthy}/{len(run.clients)} healthy",
    ]
    wait = describe_wait(run.phase, init_min_clients=run.init_min_clients, joined=run.joined,
                         warmup_ready=len(run.witnesses.received),
                         warmup_target=run.witnesses.target)
    reset = describe_model_resets(run.model_resets)
    lost = describe_model_lost(run.model_lost)
    return [*lines, *(line for line in (wait, lost, reset) if line is not None)]


def describe_witnesses(run: RunSnapshot | None) -> list[str]:
    if run is None:
        return ["witnesses: no coordinator data"]
    progress = run.witnesses
    return [
        f"witnesses {len(progress.received)}/{len(progress.elected)} sent, "
        f"quorum {len(progress.received)}/{progress.quorum} ({progress.fraction:.0%})"
    ]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def describe_training(metrics: ClientMetrics | None, error: str = "",
                      run: RunSnapshot | None = None) -> list[str]:
    """The client's training; once the run has finished, its end (the client has exited,
    so its last metrics are the final ones, not a client gone quiet)."""
    if run is not None and run.phase == "Finished":
        final = "" if metrics is None or metrics.loss is None else \
            f", final loss {metrics.loss:.4f}"
        return [f"training: finished: the run ended at step {run.step}{final}",
                *([] if metrics is None else describe_evals(metrics.evals))]
    if metrics is None:
        return [f"training: no client metrics{' (' + error + ')' if error else ''}"]
    loss = "—" if metrics.loss is None else f"{metrics.loss:.4f}"
    sizes = ", ".join(format_bytes(size) for size in metrics.last_result_sizes[:4]) or "—"
    if len(metrics.last_result_sizes) > 4:
        sizes += f" (+{len(metrics.last_result_sizes) - 4})"
    return [
        f"training: {metrics.phase or '—'} epoch {metrics.epoch} step {metrics.step} "
        f"role {metrics.role}",
        f"loss {loss}  {metrics.tokens_per_sec:,.0f} tok/s  peers {len(metrics.connected_peers)}",
        f"last results: {sizes}",
        *describe_removal(metrics),
        *describe_evals(metrics.evals),
    ]


def describe_removal(metrics: ClientMetrics) -> list[str]:
    """"taken out in epoch 2 at step 17 (health-check): a health check dropped it: ...",
    while the client is still in (or just past) the epoch it was taken out of."""
    removal = metrics.removal
    if removal is None or metrics.epoch > removal.epoch + 1:
        return []
    return [f"taken out in epoch {removal.epoch} at step {removal.step} ({removal.reason}): "
            f"{removal.detail}"]


def describe_evals(evals: dict[str, dict[str, float]]) -> list[str]:
    """The client's last eval scores as a small table (nothing before the first one):

        eval        acc    acc_norm
        arc_easy    0.600  0.400
        boolq       0.800  —
    """
    if not evals:
        return []
    width = max(len("eval"), *(len(task) for task in evals))

    def cell(scores: dict[str, float], metric: str) -> str:
        return f"{scores[metric]:.3f}" if metric in scores else "—"
    return [f"{'eval':<{width}}  acc    acc_norm"] + [
        f"{task:<{width}}  {cell(scores, 'acc'):<5}  {cell(scores, 'acc_norm')}"
        for task, scores in sorted(evals.items())]
