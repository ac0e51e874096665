"""A run on Solana as the run-manager sees it: the coordinator account over JSON-RPC.

    source = SolanaCoordinatorSource([RPC, RPC_2], run_id="my-run")
    version = await source.client_version()   # the account's client version (or raises)
    snapshot = await source.snapshot()        # RunSnapshot | None
    await source.close()

The first call finds the run's coordinator account (`psyche_solana.runs.find_run`);
later calls re-read and decode that account. `run_manager/runner.py` builds this source
when the env file sets RPC (and RUN_ID), with RPC_2 as the fallback endpoint.
"""

from __future__ import annotations

import time

from solders.pubkey import Pubkey

from psyche_common.run_view import ObservedState, RunSnapshot, build_snapshot
from psyche_solana.accounts import AccountDecodeError, CoordinatorAccount, decode_coordinator
from psyche_solana.rpc import RpcError, SolanaRpc
from psyche_solana.runs import RunNotFound, find_run
from run_manager.sources.coordinator import CoordinatorUnavailable


class SolanaCoordinatorSource:
    """A run_manager `CoordinatorSource` for a run on Solana: the client version comes from
    the coordinator account, the snapshot (for the TUI) is the decoded on-chain state.
    """

    def __init__(self, rpc_urls: list[str | None], run_id: str) -> None:
        self.run_id = run_id
        self.rpc = SolanaRpc(rpc_urls, retries=2)
        self.address: Pubkey | None = None

    async def _account(self) -> CoordinatorAccount:
        try:
            if self.address is None:
                run = await find_run(self.rpc, self.run_id)
                self.address = run.address
                return run.account
            data = await self.rpc.account_data(self.address)
            if data is None:
                raise RunNotFound(f"the account of run {self.run_id!r} is gone")
            return decode_coordinator(data)
        except (RpcError, RunNotFound, AccountDecodeError) as error:
            raise CoordinatorUnavailable(f"run {self.run_id!r} on Solana: {error}") from None

    async def client_version(self) -> str:
        return str((await self._account()).client_version)

    async def snapshot(self) -> RunSnapshot | None:
        account = await self._account()
        if account.state is None:
            return None
        # The clients joined for the next epoch are the registry's pending entries.
        return build_snapshot(ObservedState(account.state, int(time.time()), time.monotonic(), 0,
                                            joined=len(account.pending)))

    async def close(self) -> None:
        await self.rpc.close()
