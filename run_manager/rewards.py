"""This wallet's rewards in a Solana run, for the TUI's Wallet panel and its claim action.

    rewards = SolanaRewards([RPC, RPC_2], run_id, keypair)
    status = await rewards.status()        # psyche_solana.rewards.RewardStatus
    claimed, status = await rewards.claim(points)  # exactly these points; the new status
    lamports = await rewards.balance()     # the wallet's SOL
    await rewards.close()

Both read the run afresh (its coordinator account and treasurer) so that the numbers are
the chain's at that moment. Every failure is `RewardsUnavailable` with one line saying
what went wrong (the on-chain error's name for a refused claim). Built by the CLI for
Solana runs with a wallet; TCP runs have no rewards on chain and get none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from solders.keypair import Keypair

from psyche_solana.accounts import AccountDecodeError
from psyche_solana.rewards import RewardStatus, reward_status
from psyche_solana.rpc import RpcError, SolanaRpc
from psyche_solana.runs import RunHandle, RunNotFound, claim, find_run

T = TypeVar("T")


class RewardsUnavailable(Exception):
    """The rewards could not be read or claimed; the message is one line."""


class SolanaRewards:
    def __init__(self, rpc_urls: Sequence[str | None], run_id: str, wallet: Keypair,
                 treasurer_index: int | None = None) -> None:
        self.run_id = run_id
        self.wallet = wallet
        self.treasurer_index = treasurer_index
        self._rpc_urls = list(rpc_urls)
        self._rpc: SolanaRpc | None = None

    async def status(self) -> RewardStatus:
        async def read(rpc: SolanaRpc, run: RunHandle) -> RewardStatus:
            return await reward_status(rpc, run, self.wallet.pubkey())
        return await self._with_run("rewards", read)

    async def claim(self, points: int) -> tuple[int, RewardStatus]:
        """Claims exactly `points` (what the confirmation showed: the chain may have more
        by now, and those stay claimable); (points claimed, the status afterwards)."""
        if points <= 0:
            raise RewardsUnavailable(f"claim: {points} points: nothing to claim")

        async def send(rpc: SolanaRpc, run: RunHandle) -> tuple[int, RewardStatus]:
            if run.treasurer is None:
                raise RewardsUnavailable(f"run {self.run_id!r} has no treasurer: "
                                         "there are no reward tokens to claim")
            amount = await claim(rpc, run, self.wallet, points)
            after = await find_run(rpc, self.run_id, self.treasurer_index)
            return amount, await reward_status(rpc, after, self.wallet.pubkey())
        return await self._with_run("claim", send)

    async def balance(self) -> int:
        """The wallet's SOL balance in lamports (a claim pays its fee and token account)."""
        rpc = self._client()
        try:
            return await rpc.balance(self.wallet.pubkey())
        except RpcError as error:
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise RewardsUnavailable(f"balance: {first_line}") from None

    def _client(self) -> SolanaRpc:
        # One client for the app's lifetime, made on first use: on the TUI's event loop.
        if self._rpc is None:
            self._rpc = SolanaRpc(self._rpc_urls, retries=1)
        return self._rpc

    async def _with_run(self, what: str, work: Callable[[SolanaRpc, RunHandle], Awaitable[T]]) -> T:
        rpc = self._client()
        try:
            run = await find_run(rpc, self.run_id, self.treasurer_index)
            return await work(rpc, run)
        except (RpcError, RunNotFound, AccountDecodeError, ValueError) as error:
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise RewardsUnavailable(f"{what}: {first_line}") from None

    async def close(self) -> None:
        if self._rpc is not None:
            await self._rpc.close()
            self._rpc = None
