"""Before the client container starts: can this client join the run at all?

Psyche's run-manager asks `can-join` before it starts a client: a client the run will
never take (no join authorization for its wallet, a run that has finished) would only
start, be refused and exit, over and over. The supervisor asks a `JoinCheck` before each
start and stops, with the refusal's message, when there is one.

    check = SolanaJoinCheck([RPC, RPC_2], run_id, wallet_address, authorizer)
    refusal = await check.refusal()   # Refusal | None; raises CoordinatorUnavailable
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from run_manager.sources.coordinator import CoordinatorSource, CoordinatorUnavailable

RefusalReason = Literal["not-authorized", "run-finished"]


@dataclass(frozen=True)
class Refusal:
    """Why the client cannot join, for good: the supervisor stops with `message`."""

    reason: RefusalReason
    message: str


class JoinCheck(Protocol):
    async def refusal(self) -> Refusal | None:
        """None when the client may join (or may wait in the run for it to resume).

        Raises CoordinatorUnavailable when the run cannot be asked.
        """
        ...


def finished_refusal(run_id: str) -> Refusal:
    return Refusal("run-finished", f"run {run_id!r} has finished: there is nothing left to "
                                   "train, so no client is started")


class FinishedRunCheck:
    """A run whose coordinator the source shows (TCP): refuses once the run has finished.
    Authorization is the TCP coordinator's to refuse at join (the client exits 11)."""

    def __init__(self, source: CoordinatorSource, run_id: str) -> None:
        self._source = source
        self._run_id = run_id

    async def refusal(self) -> Refusal | None:
        # The version is asked first: it waits for the coordinator's first state, which
        # the snapshot (it never waits) then shows.
        await self._source.client_version()
        snapshot = await self._source.snapshot()
        if snapshot is not None and snapshot.phase == "Finished":
            return finished_refusal(self._run_id)
        return None


class SolanaJoinCheck:
    """A run on Solana: Psyche's can-join (`psyche_solana.runs.can_join`, as the
    `run-manager can-join` command asks it) for this wallet, through AUTHORIZER's grant."""

    def __init__(self, rpc_urls: list[str | None], run_id: str, wallet_address: str,
                 authorizer: str | None = None) -> None:
        # Imported here: solders is not needed by --help or a TCP run.
        from solders.pubkey import Pubkey

        from psyche_solana.rpc import SolanaRpc

        self._rpc = SolanaRpc(rpc_urls, retries=2)
        self._run_id = run_id
        self._user = Pubkey.from_string(wallet_address)
        self._authorizer = Pubkey.from_string(authorizer) if authorizer else None

    async def refusal(self) -> Refusal | None:
        from coordinator import RunState
        from psyche_solana.accounts import AccountDecodeError
        from psyche_solana.rpc import RpcError
        from psyche_solana.runs import RunNotFound, can_join, find_run

        try:
            run = await find_run(self._rpc, self._run_id)
            allowed, reason = await can_join(self._rpc, run, self._user, self._authorizer)
        except (RpcError, RunNotFound, AccountDecodeError) as error:
            raise CoordinatorUnavailable(f"run {self._run_id!r} on Solana: {error}") from None
        state = run.account.run_state
        if state is RunState.Finished:
            return finished_refusal(self._run_id)
        # can_join also says no to an authorized wallet while the run is halted (paused,
        # not yet started): the client may join it then and waits for it to resume.
        if allowed or (state.halted and reason.startswith("authorized")):
            return None
        return Refusal("not-authorized", f"not authorized to join run {self._run_id!r}: "
                       f"{reason} (ask the run's join authority for an authorization, or set "
                       "AUTHORIZER to the grantee that lists this wallet as a delegate)")

    async def close(self) -> None:
        await self._rpc.close()
