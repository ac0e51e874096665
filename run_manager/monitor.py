"""Polls the run's data sources into the Dashboard: coordinator, client metrics, wallet
(its SOL balance and, in a Solana run, its rewards: `rewards`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol

from psyche_common.metrics_schema import ClientMetrics
from run_manager.sources.coordinator import CoordinatorSource
from run_manager.view import Dashboard

if TYPE_CHECKING:  # solders loads only for Solana runs
    from run_manager.rewards import SolanaRewards

Part = Literal["run", "training", "wallet"]


class MetricsSource(Protocol):
    async def fetch(self) -> ClientMetrics: ...

    async def close(self) -> None: ...


class Monitor:
    """Refreshes `dashboard` every `interval_s`; calls `on_change(part)` for what changed."""

    def __init__(
        self,
        dashboard: Dashboard,
        coordinator: CoordinatorSource,
        metrics: MetricsSource | None,
        on_change: Callable[[Part], None],
        rpc_url: str | None = None,
        interval_s: float = 1.0,
        balance_interval_s: float = 30.0,
        rewards: SolanaRewards | None = None,
    ) -> None:
        self.dashboard = dashboard
        self._coordinator = coordinator
        self._metrics = metrics
        self._on_change = on_change
        self._rpc_url = rpc_url
        self._interval_s = interval_s
        self._balance_interval_s = balance_interval_s
        self._balance_checked_at = float("-inf")
        self._rewards = rewards

    async def poll_once(self) -> None:
        try:
            self.dashboard.apply_run(await self._coordinator.snapshot())
        except Exception as error:  # a source's failure must not end the TUI; it is shown
            self.dashboard.container.message = f"coordinator: {error}"
            self.dashboard.coordinator_error = str(error).strip().split("\n")[0]
        else:
            self.dashboard.coordinator_error = ""
        self.dashboard.coordinator_heard = self._coordinator.heard()
        self._on_change("run")
        if self._metrics is not None:
            from psyche_common.metrics_source import MetricsUnavailable

            try:
                self.dashboard.apply_metrics(await self._metrics.fetch())
            except MetricsUnavailable as error:
                self.dashboard.metrics_error = str(error)
            self._on_change("training")
        if self._due_for_balance():
            await self._refresh_balance()
            self._on_change("wallet")

    def _due_for_balance(self) -> bool:
        wallet = self.dashboard.wallet
        if self._rpc_url is None or wallet.address is None:
            return False
        return time.monotonic() - self._balance_checked_at >= self._balance_interval_s

    async def _refresh_balance(self) -> None:
        from psyche_common.wallet import WalletError, get_balance

        assert self._rpc_url is not None and self.dashboard.wallet.address is not None
        self._balance_checked_at = time.monotonic()
        try:
            lamports = await asyncio.to_thread(
                get_balance, self._rpc_url, self.dashboard.wallet.address
            )
        except WalletError as error:
            self.dashboard.wallet.error = str(error)
            return
        self.dashboard.wallet.balance_lamports = lamports
        self.dashboard.wallet.error = ""
        if self._rewards is not None:
            from run_manager.rewards import RewardsUnavailable

            try:
                self.dashboard.wallet.apply_rewards(await self._rewards.status())
            except RewardsUnavailable as error:
                self.dashboard.wallet.error = str(error)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval_s)
