"""A run on Solana as the run-manager sees it: the coordinator account, followed over
Solana's PubSub WebSocket (accountSubscribe).

    source = SolanaCoordinatorSource([RPC, RPC_2], run_id="my-run", ws_urls=[WS_RPC, WS_RPC_2])
    version = await source.client_version()   # the account's client version (or raises)
    snapshot = await source.snapshot()        # RunSnapshot | None
    await source.close()

The first call finds the run's coordinator account (`psyche_solana.runs.find_run`) and
starts following it (psyche_solana.subscription: WS_RPC, then WS_RPC_2, each derived
from its RPC URL when not given; slow JSON-RPC polling while no WebSocket answers). Later
calls answer from the last account seen, with no RPC call. `run_manager/runner.py` builds
this source when the env file sets RPC (and RUN_ID).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from solders.pubkey import Pubkey

from psyche_common.run_view import ObservedState, RunSnapshot, build_snapshot
from psyche_solana.accounts import AccountDecodeError, CoordinatorAccount, decode_coordinator
from psyche_solana.rpc import NONCE_SLICE, RpcError, SolanaRpc
from psyche_solana.runs import RunNotFound, find_run
from psyche_solana.subscription import AccountSubscription, ws_urls_for
from run_manager.sources.coordinator import CoordinatorUnavailable, Heard


class SolanaCoordinatorSource:
    """A run_manager `CoordinatorSource` for a run on Solana: the client version comes from
    the coordinator account, the snapshot (for the TUI) is the decoded on-chain state.
    """

    def __init__(self, rpc_urls: Sequence[str | None], run_id: str,
                 ws_urls: Sequence[str | None] = (), fallback_poll_s: float = 2.0) -> None:
        self.run_id = run_id
        self.rpc = SolanaRpc(rpc_urls, retries=2)
        self.ws_urls = ws_urls_for(rpc_urls, ws_urls)
        self.fallback_poll_s = fallback_poll_s
        self.address: Pubkey | None = None
        self.subscription: AccountSubscription | None = None
        self._latest: CoordinatorAccount | None = None
        self._problem: str | None = None     # why the last account seen could not be used
        self._follower: asyncio.Task[None] | None = None

    async def _account(self) -> CoordinatorAccount:
        try:
            if self.address is None:
                run = await find_run(self.rpc, self.run_id)
                self.address, self._latest = run.address, run.account
                self.subscription = AccountSubscription(
                    self.rpc, self.ws_urls, run.address, fallback_poll_s=self.fallback_poll_s,
                    poll_slice=NONCE_SLICE)
                self._follower = asyncio.create_task(self._follow(self.subscription))
                return run.account
        except (RpcError, RunNotFound, AccountDecodeError) as error:
            raise CoordinatorUnavailable(f"run {self.run_id!r} on Solana: {error}") from None
        if self._problem is not None:
            raise CoordinatorUnavailable(f"run {self.run_id!r} on Solana: {self._problem}")
        assert self._latest is not None  # set with the address
        return self._latest

    async def _follow(self, subscription: AccountSubscription) -> None:
        async for data in subscription.changes():
            if not data:
                self._problem = f"the account of run {self.run_id!r} is gone"
                continue
            try:
                self._latest, self._problem = decode_coordinator(data), None
            except AccountDecodeError as error:
                self._problem = str(error)

    async def client_version(self) -> str:
        return str((await self._account()).client_version)

    async def snapshot(self) -> RunSnapshot | None:
        account = await self._account()
        if account.state is None:
            return None
        # The clients joined for the next epoch are the registry's pending entries.
        return build_snapshot(ObservedState(account.state, int(time.time()), time.monotonic(), 0,
                                            joined=len(account.pending)))

    def heard(self) -> Heard | None:
        return None  # the chain does not die with a coordinator: a stall is a phase overdue

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
        await self.rpc.close()
