"""What the operator sees, as plain text: shared by the TUI panels and `--no-tui` log lines.

`Dashboard` accumulates the latest of everything (run snapshot, client metrics, loss
history, container state and log tail, wallet); the `describe_*` functions turn each
part into short lines. No Textual here: `--no-tui` must not import it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from run_manager.docker_supervisor import (
    ContainerExited,
    ContainerStarted,
    ImagePull,
    LogLine,
    RestartScheduled,
    StaleContainerRemoved,
    SupervisorEvent,
    SupervisorFinished,
)
from run_manager.sources.coordinator import RunSnapshot
from run_manager.sources.metrics import ClientMetrics

LOG_TAIL_LINES = 500
LOSS_HISTORY_POINTS = 2000


@dataclass
class ContainerView:
    image: str = ""
    state: str = "not started"
    restarts: int = 0
    crash_restarts: int = 0
    last_exit_code: int | None = None
    pull_current_bytes: int = 0
    pull_total_bytes: int = 0
    message: str = ""


@dataclass
class WalletView:
    address: str | None = None
    balance_lamports: int | None = None
    points: int | None = None
    error: str = ""


@dataclass
class Dashboard:
    run: RunSnapshot | None = None
    metrics: ClientMetrics | None = None
    metrics_error: str = ""
    losses: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=LOSS_HISTORY_POINTS))
    container: ContainerView = field(default_factory=ContainerView)
    wallet: WalletView = field(default_factory=WalletView)
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))

    def apply_metrics(self, metrics: ClientMetrics) -> None:
        self.metrics = metrics
        self.metrics_error = ""
        # One loss point per step: the endpoint is polled faster than steps advance.
        if metrics.loss is not None and (not self.losses or self.losses[-1][0] != metrics.step):
            self.losses.append((metrics.step, metrics.loss))

    def apply_run(self, snapshot: RunSnapshot | None) -> None:
        self.run = snapshot
        if snapshot is not None and self.wallet.address is not None:
            for client in snapshot.clients:
                if client.id == self.wallet.address and client.points is not None:
                    self.wallet.points = client.points

    def apply_event(self, event: SupervisorEvent) -> None:
        view = self.container
        match event:
            case StaleContainerRemoved(container_id=container_id):
                view.message = f"removed stale container {container_id[:12]}"
            case ImagePull(progress=progress):
                view.image, view.state = progress.image, "pulling"
                view.pull_current_bytes = progress.current_bytes
                view.pull_total_bytes = progress.total_bytes
            case ContainerStarted(image=image, restarts=restarts):
                view.image, view.state, view.restarts = image, "running", restarts
                view.message = ""
            case LogLine(text=text):
                self.log_tail.append(text)
            case ContainerExited(exit_code=code):
                view.state, view.last_exit_code = f"exited ({code})", code
            case RestartScheduled(reason=reason, delay_s=delay, crash_restarts=crashes):
                view.state, view.crash_restarts = "restarting", crashes
                view.message = f"restart ({reason}) in {delay:.0f}s"
            case SupervisorFinished(reason=reason, message=message):
                view.state, view.message = reason, message


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


def describe_container(view: ContainerView) -> list[str]:
    state = view.state
    if view.state == "pulling" and view.pull_total_bytes:
        state += f" {view.pull_current_bytes / view.pull_total_bytes:.0%}"
    lines = [
        f"container {view.image or '—'}: {state}",
        f"restarts {view.restarts} (crashes in a row {view.crash_restarts})",
    ]
    if view.message:
        lines.append(view.message)
    return lines


def describe_wallet(view: WalletView) -> list[str]:
    from run_manager.wallet import format_sol

    balance = "—" if view.balance_lamports is None else format_sol(view.balance_lamports)
    points = "—" if view.points is None else str(view.points)
    line = f"wallet {view.address or '—'}  balance {balance}  points {points}"
    return [line + (f" ({view.error})" if view.error else "")]
