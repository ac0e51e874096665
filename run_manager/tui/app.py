"""The run-manager's TUI: run, witnesses, training, container, verification, wallet and
P2P panels (verification only while the run verifies; this client's ejection is also a
notification).

The supervisor and the monitor run as async workers on the app's event loop; their
events update the shared Dashboard and the panels redraw from it. Keys: q (or ctrl+c)
stops the client gracefully and quits, r restarts the client, l shows the full-screen
logs, c claims this wallet's reward tokens after a confirmation (offered only in a
Solana run with a treasurer, once the chain has been read: `rewards`), a claims from
the mining pool or airdrop highlighted in the Pools & airdrops panel (Solana runs with
a wallet: `funds`). SIGINT, SIGTERM and SIGHUP (`run_tui`) stop as q does; a second stop kills the
container at once. The app exits once the container is gone, leaving the terminal as
it found it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal
from textual.driver import Driver
from textual.widgets import Footer, Header

from psyche_common.metrics_schema import Removal
from psyche_common.stopping import StopSignals, hangup_safe_driver
from psyche_common.ui.run_panel import RunPanel
from psyche_common.ui.training_panel import TrainingPanel
from psyche_common.ui.witness_panel import WitnessPanel
from run_manager.docker_supervisor import LogLine, Supervisor, SupervisorEvent, SupervisorFinished
from run_manager.monitor import Monitor, Part
from run_manager.tui.messages import (
    ClientEjected,
    DashboardChanged,
    FundsClaimed,
    SupervisorEventPosted,
)
from run_manager.tui.widgets import (
    ClaimScreen,
    ContainerPanel,
    P2PPanel,
    VerificationPanel,
    WalletPanel,
)
from run_manager.tui.widgets.funds_panel import FundsPanel
from run_manager.tui.widgets.log_screen import LogScreen
from run_manager.tui.widgets.run_panel import CoordinatorRunPanel
from run_manager.view import Dashboard

if TYPE_CHECKING:  # solders loads only for Solana runs
    from run_manager.funds import WalletFunds
    from run_manager.rewards import SolanaRewards

# The Wallet panel's own refresh (SOL balance, earned, claimed): it goes on after the run
# finished, when the monitor has stopped, since the operator claims then.
WALLET_REFRESH_S = 30.0
SupervisorFactory = Callable[[Callable[[SupervisorEvent], None]], Supervisor]
MonitorFactory = Callable[[Callable[[Part], None]], Monitor]


class RunManagerApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "psyche run-manager"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "stop", "Stop & quit"),
        Binding("r", "restart_client", "Restart client"),
        Binding("l", "show_logs", "Logs"),
        Binding("c", "claim", "Claim rewards"),
        Binding("a", "claim_funds", "Claim pool/airdrop"),
    ]

    def __init__(
        self,
        dashboard: Dashboard,
        supervisor_factory: SupervisorFactory | None = None,
        monitor_factory: MonitorFactory | None = None,
        rewards: SolanaRewards | None = None,
        wallet_refresh_s: float = WALLET_REFRESH_S,
        funds: WalletFunds | None = None,
    ) -> None:
        super().__init__()
        self.dashboard = dashboard
        self.rewards = rewards
        self.funds = funds  # this wallet's mining pools and airdrops
        self.wallet_refresh_s = wallet_refresh_s
        self._supervisor_factory = supervisor_factory
        self._monitor_factory = monitor_factory
        self.supervisor: Supervisor | None = None
        self.finished: SupervisorFinished | None = None
        self._stop_polling = asyncio.Event()
        self.stop_requests = 0  # q / ctrl+c / signals so far
        self.told_removal: Removal | None = None  # the last removal notified

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Grid(id="panels"):
            yield CoordinatorRunPanel(id="run")
            yield WitnessPanel(id="witnesses")
            yield TrainingPanel(id="training")
            yield ContainerPanel(id="container")
        yield VerificationPanel(id="verification")
        with Horizontal(id="bottom"):
            yield WalletPanel(id="wallet")
            yield P2PPanel(id="p2p")
        yield FundsPanel(self.funds, self.wallet_refresh_s, id="funds")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_panels()
        self.query_one(ContainerPanel).replay(list(self.dashboard.log_tail))
        if self._supervisor_factory is not None:
            self.supervisor = self._supervisor_factory(self._post_supervisor_event)
            self._supervise()
        if self._monitor_factory is not None:
            self._poll(self._monitor_factory(self._post_dashboard_change))
        if self.rewards is not None:
            self.set_interval(self.wallet_refresh_s, self._refresh_wallet)

    @work(exclusive=True, group="supervisor")
    async def _supervise(self) -> None:
        assert self.supervisor is not None
        self.finished = await self.supervisor.run()
        self._stop_polling.set()
        if self.finished.reason == "stopped":
            self.exit()
        else:  # finished, refused, gave up or failed: the reason stays until the operator quits
            self.notify(self.finished.message, title=self.finished.reason,
                        severity="error" if self.finished.failed else "information",
                        timeout=600)

    @work(exclusive=True, group="monitor")
    async def _poll(self, monitor: Monitor) -> None:
        await monitor.run(self._stop_polling)

    def _post_dashboard_change(self, part: Part) -> None:
        self.post_message(DashboardChanged(part))

    def _post_supervisor_event(self, event: SupervisorEvent) -> None:
        self.post_message(SupervisorEventPosted(event))

    @on(SupervisorEventPosted)
    def _apply_supervisor_event(self, message: SupervisorEventPosted) -> None:
        self.dashboard.apply_event(message.event)
        if not self.is_running:  # shutting down: the event is kept, not drawn
            return
        if isinstance(message.event, LogLine):
            self.query_one(ContainerPanel).append_log(message.event.text)
            if isinstance(self.screen, LogScreen):
                self.screen.append_log(message.event.text)
        else:
            self.query_one(ContainerPanel).show(self.dashboard)

    @on(DashboardChanged)
    def _apply_dashboard_change(self, message: DashboardChanged) -> None:
        self.refresh_panels(message.part)
        self._alert_removal()

    def _alert_removal(self) -> None:
        """A notification, once per removal, when the client says the coordinator took it
        out of an epoch (the Training panel keeps the line)."""
        metrics = self.dashboard.metrics
        removal = None if metrics is None else metrics.removal
        if removal is None or removal == self.told_removal:
            return
        self.told_removal = removal
        self.notify(f"epoch {removal.epoch}, step {removal.step}: {removal.detail}",
                    title=f"client taken out of the epoch ({removal.reason})",
                    severity="warning", timeout=600)

    @on(ClientEjected)
    def _alert_ejection(self, message: ClientEjected) -> None:
        self.notify(message.text, title="client ejected", severity="error", timeout=600)

    def refresh_panels(self, part: Part | None = None) -> None:
        """Redraws the panels showing `part` (all of them when None)."""
        if not self.is_running:  # shutting down: a change can arrive after the panels went
            return
        if part in (None, "run"):
            self.query_one(RunPanel).show(self.dashboard)
            self.query_one(WitnessPanel).show(self.dashboard)
        if part in (None, "run", "training"):  # the run's end is the training's too
            self.query_one(TrainingPanel).show(self.dashboard)
        if part in (None, "run", "training"):
            self.query_one(VerificationPanel).show(self.dashboard)
            self.query_one(P2PPanel).show(self.dashboard)
        if part in (None, "wallet", "run"):
            self.query_one(WalletPanel).show(self.dashboard)
            self.refresh_bindings()  # c is offered once the run's treasurer is known
        if part is None:
            self.query_one(ContainerPanel).show(self.dashboard)

    def get_driver_class(self) -> type[Driver]:
        # A closed terminal (SIGHUP) must not stop the app from stopping the container.
        return hangup_safe_driver(super().get_driver_class())

    def action_stop(self) -> None:
        self.stop_for("q")

    def action_help_quit(self) -> None:  # ctrl+c: stop, as SIGINT does (not "press ctrl+q")
        self.stop_for("ctrl+c")

    def stop_for(self, reason: str) -> None:
        """Stop the client container, then exit (q, ctrl+c, SIGINT, SIGTERM, SIGHUP); a
        second stop kills the container at once. Safe from a signal handler on this loop."""
        self.stop_requests += 1
        if self.supervisor is None or self.finished is not None:
            self._stop_polling.set()
            self.exit()
            return
        if self.stop_requests > 1:
            with contextlib.suppress(Exception):  # unmounting
                self.notify(f"stopping now ({reason} again): killing the container",
                            severity="warning")
            self.supervisor.hurry()
            return
        with contextlib.suppress(Exception):
            self.notify(f"stopping… ({reason}): the client container, then the run-manager")
        self.supervisor.request_stop()  # the supervise worker exits the app once it is removed

    def action_restart_client(self) -> None:
        if self.supervisor is None:
            self.notify("no client container to restart", severity="warning")
            return
        self.notify("restarting the client container…")
        self.supervisor.request_restart()

    def action_show_logs(self) -> None:
        if not isinstance(self.screen, LogScreen):
            self.push_screen(LogScreen(self.dashboard.log_tail))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # No claim on TCP runs, runs without a treasurer, or before the chain was read.
        if action == "claim":
            return self.rewards is not None and self.dashboard.wallet.can_claim
        if action == "claim_funds":
            return self.funds is not None
        return True

    def action_claim(self) -> None:
        wallet, status = self.dashboard.wallet, self.dashboard.wallet.rewards
        if self.rewards is None or status is None or status.mint is None:
            return  # not offered (check_action); a key press from before the refresh
        if status.claimable <= 0:
            self.notify(f"nothing to claim: {status.earned} points earned, "
                        f"{status.claimed} claimed", severity="warning")
            return
        from psyche_solana.rewards import format_units

        amount = status.claimable  # computed once: shown, then sent as it is
        question = (f"Claim {amount} points = "
                    f"{format_units(amount, status.decimals)} reward tokens "
                    f"({status.mint})\nto wallet {wallet.address}?\n\n"
                    "This sends a transaction signed by the wallet.")

        def answered(confirmed: bool | None) -> None:
            if confirmed:
                self.notify("claiming… (the transaction is on its way)")
                self._send_claim(amount)

        self.push_screen(ClaimScreen(question, amount), answered)

    def action_claim_funds(self) -> None:
        self.query_one(FundsPanel).ask_claim()

    @on(FundsClaimed)
    def _funds_claimed(self) -> None:
        if self.rewards is not None:  # the fee left the SOL balance the Wallet panel shows
            self._refresh_wallet()

    @work(exclusive=True, group="claim")
    async def _send_claim(self, points: int) -> None:
        from psyche_solana.rewards import format_units
        from run_manager.rewards import RewardsUnavailable

        assert self.rewards is not None  # only after the dialog, which needs it
        wallet = self.dashboard.wallet
        try:
            amount, status = await self.rewards.claim(points)
        except RewardsUnavailable as error:
            wallet.last_claim = f"claim failed: {error}"
            self.notify(str(error), title="claim failed", severity="error", timeout=30)
        else:
            wallet.apply_rewards(status)
            wallet.last_claim = (f"claimed {amount} points: reward token balance now "
                                 f"{format_units(status.held, status.decimals)}")
            self.notify(wallet.last_claim, title="rewards claimed", timeout=30)
        self.refresh_panels("wallet")
        await self._read_wallet()  # the fee and the token account's rent left the SOL balance

    @work(exclusive=True, group="wallet")
    async def _refresh_wallet(self) -> None:
        await self._read_wallet()

    async def _read_wallet(self) -> None:
        """The wallet's SOL balance and rewards from the chain, into the Wallet panel."""
        from run_manager.rewards import RewardsUnavailable

        assert self.rewards is not None
        wallet = self.dashboard.wallet
        try:
            wallet.balance_lamports = await self.rewards.balance()
            wallet.apply_rewards(await self.rewards.status())
        except RewardsUnavailable as error:
            wallet.error = str(error)
        else:
            wallet.error = ""
        self.refresh_panels("wallet")


async def run_tui(app: RunManagerApp) -> None:
    """The app until it exits: after q, or after a signal once the container is stopped."""
    signals = StopSignals()

    def on_signal(sig: signal.Signals) -> None:
        app.stop_for(sig.name)

    signals.on_signal(on_signal)
    signals.install()
    try:
        await app.run_async()
    finally:
        signals.remove()
