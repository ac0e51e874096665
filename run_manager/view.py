"""What the operator sees, as plain text: shared by the TUI panels and `--no-tui` log lines.

`Dashboard` extends the shared `RunView` (run snapshot, client metrics, loss history;
psyche_common.ui.view) with the container state and log tail, the wallet and its rewards,
and the client's P2P traffic (run_manager.p2p_view); `describe_container`,
`describe_wallet` and `describe_verification` turn those into short lines
(`ejection_alert`: the line saying that this operator's client was ejected, and why). No
Textual here: `--no-tui` must not import it.

This operator's client is the run's client whose key is the wallet's: on Solana a
client's identity on chain is its wallet's public key, which the coordinator lists as
hex (the wallet is base58), so the two are compared as bytes (`same_key`).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from psyche_common.metrics_schema import ClientMetrics
from psyche_common.run_view import RunReport, RunSnapshot
from psyche_common.ui.view import RunView
from run_manager.docker_supervisor import (
    ContainerExited,
    ContainerStarted,
    ImagePull,
    ImagePulled,
    LogLine,
    RestartScheduled,
    StaleContainerRemoved,
    SupervisorEvent,
    SupervisorFinished,
)
from run_manager.p2p_view import P2PView
from run_manager.sources.coordinator import Heard

if TYPE_CHECKING:  # solders loads only for Solana runs
    from psyche_solana.rewards import RewardStatus

LOG_TAIL_LINES = 500
# httpx's request lines ("HTTP Request: POST http://... "HTTP/1.1 200 OK""), as a client
# logs them in any of its log formats; older clients log one per RPC poll.
HTTP_REQUEST_LINE = re.compile(r'HTTP Request: [A-Z]+ \S+ \\?"HTTP/')


def is_http_request_line(text: str) -> bool:
    """A client's HTTP request line: kept in the full log, left out of the event pane."""
    return HTTP_REQUEST_LINE.search(text) is not None


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
    """The wallet's public key, base58."""
    balance_lamports: int | None = None
    points: int | None = None
    """Points earned, from the run's client list or the chain's reward entries."""
    rewards: RewardStatus | None = None
    """Claimed, claimable and the reward token balance (Solana runs with a wallet)."""
    last_claim: str = ""
    """The outcome of the last claim from the TUI: what it paid, or why it failed."""
    error: str = ""

    @property
    def can_claim(self) -> bool:
        """A treasurer run: its reward token can be claimed from here."""
        return self.rewards is not None and self.rewards.mint is not None

    def apply_rewards(self, status: RewardStatus) -> None:
        self.rewards = status
        self.points = status.earned


@dataclass
class Dashboard(RunView):
    """The shared run view plus what only the run-manager has: its container and wallet."""

    container: ContainerView = field(default_factory=ContainerView)
    coordinator_heard: Heard | None = None
    """When the coordinator last spoke (the source's `heard`): its silence is shown."""
    coordinator_error: str = ""
    """Why the last read of the coordinator failed; "" once one succeeds."""
    wallet: WalletView = field(default_factory=WalletView)
    p2p: P2PView = field(default_factory=P2PView)
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))

    def apply_run(self, snapshot: RunSnapshot | None) -> None:
        super().apply_run(snapshot)
        if snapshot is not None:
            for client in snapshot.clients:
                if self.is_own_client(client.id) and client.points is not None:
                    self.wallet.points = client.points

    def apply_metrics(self, metrics: ClientMetrics, now: float | None = None) -> None:
        super().apply_metrics(metrics)
        self.p2p.sample(metrics, now)

    def is_own_client(self, client_id: str) -> bool:
        return self.wallet.address is not None and same_key(client_id, self.wallet.address)

    def client_label(self, client_id: str) -> str:
        """The client list's name for a client; this operator's also by its wallet."""
        label = super().client_label(client_id)
        if self.wallet.address is not None and self.is_own_client(client_id):
            label += f" (you: {_short(self.wallet.address)})"
        return label

    def apply_event(self, event: SupervisorEvent) -> None:
        view = self.container
        match event:
            case StaleContainerRemoved(container_id=container_id):
                view.message = f"removed stale container {container_id[:12]}"
            case ImagePull(progress=progress):
                view.image, view.state = progress.image, "pulling"
                view.pull_current_bytes = progress.current_bytes
                view.pull_total_bytes = progress.total_bytes
            case ImagePulled(image=image, digest=digest):
                view.message = f"pulled {image}: digest {digest} verified"
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
    """The wallet line, then (once the chain has been read) its rewards in the run:

        wallet 7xKX…  balance 1.500000000 SOL  points 120
        rewards: 120 earned · 20 claimed · 100 claimable · reward token 0.00002 (20 base units)
    """
    from psyche_common.wallet import format_sol

    balance = "—" if view.balance_lamports is None else format_sol(view.balance_lamports)
    points = "—" if view.points is None else str(view.points)
    line = f"wallet {view.address or '—'}  balance {balance}  points {points}"
    lines = [line + (f" ({view.error})" if view.error else "")]
    rewards = view.rewards
    if rewards is not None:
        from psyche_solana.rewards import format_units

        text = f"rewards: {rewards.earned} earned · {rewards.claimed} claimed"
        if rewards.mint is None:
            text += " · no reward token (the run has no treasurer)"
        else:
            text += (f" · {rewards.claimable} claimable · reward token "
                     f"{format_units(rewards.held, rewards.decimals)} ({rewards.held} base units)")
        lines.append(text)
    if view.last_claim:
        lines.append(view.last_claim)
    return lines


def same_key(client_id: str, wallet_address: str) -> bool:
    """Whether a client id (hex as the coordinator lists it, or base58) is this wallet."""
    wallet = _key_bytes(wallet_address)
    return wallet is not None and _key_bytes(client_id) == wallet


def _key_bytes(text: str) -> bytes | None:
    if len(text) == 64:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    from solders.pubkey import Pubkey

    try:
        return bytes(Pubkey.from_string(text))
    except ValueError:
        return None


def describe_verification(run: RunSnapshot | None, metrics: ClientMetrics | None) -> list[str]:
    """The run's verification (reports, ejections) and this client's part in it; no lines
    while the run does not verify and the client has nothing to tell."""
    lines: list[str] = []
    verification = None if run is None else run.verification
    if verification is not None and (verification.percent > 0 or verification.reports):
        lines.append(f"run: verification {verification.percent}%  "
                     f"{_plural(len(verification.reports), 'report')} this epoch  "
                     f"{len(verification.ejected)} ejected")
    if metrics is not None and (lines or _client_verifies(metrics)):
        lines.append(f"this client: following {_plural(metrics.verification_following, 'trainer')}"
                     f" · {metrics.verifications_passed} passed"
                     f" · {metrics.verifications_failed} failed"
                     f" · {_plural(metrics.verification_reports_sent, 'report')} sent")
    alert = ejection_alert(run, metrics)
    if alert is not None:
        lines.append(alert)
    return lines


def ejection_alert(run: RunSnapshot | None, metrics: ClientMetrics | None) -> str | None:
    """"EJECTED in epoch E by N followers (…)" and, while the coordinator still holds the
    epoch's reports, what their replays found; None when this client was not ejected."""
    if metrics is None or not metrics.ejected:
        return None
    followers = metrics.ejected_by
    names = ", ".join(_short(f) for f in followers)
    text = (f"EJECTED in epoch {metrics.ejected_epoch} by {_plural(len(followers), 'follower')}"
            + (f" ({names})" if names else ""))
    reports = _reports_against_me(run, metrics)
    if not reports:
        return text + ": their replays did not reproduce this client's results"
    steps = ", ".join(str(r.step) for r in reports)
    worst = max(reports, key=lambda r: r.manhattan)
    return (text + f": their replays of step{'s' if len(reports) > 1 else ''} {steps} "
            f"differ (jaccard {worst.jaccard:.3f}, hamming {worst.hamming:.3f}, "
            f"manhattan {worst.manhattan:.3f})")


def _reports_against_me(run: RunSnapshot | None, metrics: ClientMetrics) -> list[RunReport]:
    """The reports that ejected this client, if the run still shows that epoch.

    The client's metrics name its followers, not its own id: the accused is the ejected
    client those followers reported (the one most of them reported, should they have
    reported several).
    """
    if run is None or run.epoch != metrics.ejected_epoch:
        return []
    ejected = set(run.verification.ejected)
    reports = [r for r in run.verification.reports
               if r.reporter in metrics.ejected_by and (not ejected or r.accused in ejected)]
    if not reports:
        return []
    accused = [r.accused for r in reports]
    me = max(accused, key=accused.count)
    return sorted((r for r in reports if r.accused == me), key=lambda r: r.step)


def _client_verifies(metrics: ClientMetrics) -> bool:
    return bool(metrics.verification_following or metrics.verifications_passed
                or metrics.verifications_failed or metrics.verification_reports_sent
                or metrics.ejected)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _short(identity: str) -> str:
    return identity if len(identity) <= 16 else f"{identity[:6]}…{identity[-6:]}"
