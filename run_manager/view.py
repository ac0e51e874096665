"""What the operator sees, as plain text: shared by the TUI panels and `--no-tui` log lines.

`Dashboard` extends the shared `RunView` (run snapshot, client metrics, loss history;
psyche_common.ui.view) with the container state and log tail and the wallet;
`describe_container` and `describe_wallet` turn those into short lines. No Textual here:
`--no-tui` must not import it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from psyche_common.run_view import RunSnapshot
from psyche_common.ui.view import RunView
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

LOG_TAIL_LINES = 500


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
class Dashboard(RunView):
    """The shared run view plus what only the run-manager has: its container and wallet."""

    container: ContainerView = field(default_factory=ContainerView)
    wallet: WalletView = field(default_factory=WalletView)
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))

    def apply_run(self, snapshot: RunSnapshot | None) -> None:
        super().apply_run(snapshot)
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
    from psyche_common.wallet import format_sol

    balance = "—" if view.balance_lamports is None else format_sol(view.balance_lamports)
    points = "—" if view.points is None else str(view.points)
    line = f"wallet {view.address or '—'}  balance {balance}  points {points}"
    return [line + (f" ({view.error})" if view.error else "")]
