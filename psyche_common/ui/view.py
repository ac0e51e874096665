"""What an operator sees of a run, as plain text: the run snapshot, the client's metrics
and its loss history, and the `describe_*` lines the panels and `--no-tui` logs show.

No Textual here: `--no-tui` must not import it. The panels are in this package too
(`run_panel`, `witness_panel`, `training_panel`), shared by the run-manager's TUI and the
client's own `--logs tui`.
"""

from __future__ import annotations

from collections import deque
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


def describe_run(run: RunSnapshot | None) -> list[str]:
    if run is None:
        return ["run: no coordinator data"]
    timer = format_duration(run.phase_elapsed_s)
    if run.phase_timeout_s is not None:
        timer += f" / {format_duration(run.phase_timeout_s)}"
    healthy = sum(1 for c in run.clients if c.state == "Healthy")
    return [
        f"run {run.run_id}: {run.phase} {timer}",
        f"epoch {run.epoch}  step {run.step}  clients {healthy}/{len(run.clients)} healthy",
    ]


def describe_witnesses(run: RunSnapshot | None) -> list[str]:
    if run is None:
        return ["witnesses: no coordinator data"]
    progress = run.witnesses
    return [
        f"witnesses {len(progress.received)}/{len(progress.elected)} sent, "
        f"quorum {len(progress.received)}/{progress.quorum} ({progress.fraction:.0%})"
    ]


def describe_training(metrics: ClientMetrics | None, error: str = "") -> list[str]:
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
    ]
