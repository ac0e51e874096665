"""No RUN_ID in the env file: pick a run the wallet may join, as Psyche's run-manager does.

Psyche (tools/rust-tools/run-manager/src/docker/manager.rs, `find_joinable_runs` and
`select_best_run`; docker/coordinator_client.rs, `can_user_join_run`):

1. every run of the coordinator program;
2. minus the halted ones (Uninitialized, Finished, Paused);
3. with `--authorizer KEY`, only the runs whose join authority is KEY;
4. only the runs the wallet may join: an active join authorization from the run's join
   authority for grantee 11111111111111111111111111111111 (permissionless), for the
   wallet, or for AUTHORIZER (a grantee listing the wallet as delegate), tried in that
   order; the grantee that matched is what the client joins as (its AUTHORIZER);
5. WaitingForMembers first, the others in listing order; the first one wins.

The candidates and the choice are printed (`describe`), as Psyche prints them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.limits import RunState

if TYPE_CHECKING:
    from solders.pubkey import Pubkey

    from psyche_solana.accounts import CoordinatorAccount
    from psyche_solana.rpc import SolanaRpc


class NoJoinableRun(LookupError):
    """No run on the cluster is open to this wallet; the message says what was looked at."""


class DiscoveryFailed(Exception):
    """The runs could not be listed (no endpoint answered, an account did not decode)."""


@dataclass(frozen=True)
class JoinableRun:
    run_id: str
    state: RunState
    clients: int
    min_clients: int
    grantee: Pubkey
    """The authorization grantee that lets the wallet join: the client's AUTHORIZER."""

    def describe(self) -> str:
        """`id (state, clients)`, with Psyche's client counts."""
        if self.clients < self.min_clients:
            clients = f"{self.clients}/{self.min_clients} waiting"
        else:
            clients = f"{self.clients} training"
        return f"{self.run_id} ({self.state.name}, {clients})"


async def _grantee(rpc: SolanaRpc, account: CoordinatorAccount, user: Pubkey,
                   delegate: Pubkey | None) -> Pubkey | None:
    from solders.pubkey import Pubkey

    from psyche_solana.runs import read_authorization

    for grantee in (Pubkey.default(), user, delegate):
        if grantee is None:
            continue
        authorization = await read_authorization(rpc, account.join_authority, grantee)
        if authorization is not None and authorization.is_valid_for(user):
            return grantee
    return None


async def find_joinable_runs(rpc: SolanaRpc, user: Pubkey, join_authority: Pubkey | None = None,
                             delegate: Pubkey | None = None) -> list[JoinableRun]:
    """Steps 1-5 above, best first."""
    from psyche_solana.runs import list_runs

    found = []
    for _, account in await list_runs(rpc):
        if account.run_state.halted or account.state is None:
            continue
        if join_authority is not None and account.join_authority != join_authority:
            continue
        grantee = await _grantee(rpc, account, user, delegate)
        if grantee is None:
            continue
        found.append(JoinableRun(account.run_id, account.run_state,
                                 len(account.state.epoch_state.clients),
                                 account.state.config.min_clients, grantee))
    # sorted() is stable: the others keep the listing order, as Psyche's sort_by_key.
    return sorted(found, key=lambda run: run.state != RunState.WaitingForMembers)


def pick_run(rpc_urls: list[str | None], user: Pubkey, join_authority: Pubkey | None,
             delegate: Pubkey | None) -> tuple[JoinableRun, list[JoinableRun]]:
    """(the chosen run, every candidate); NoJoinableRun when there is none,
    DiscoveryFailed when the cluster could not be asked."""
    from psyche_solana.accounts import AccountDecodeError
    from psyche_solana.ids import coordinator_program
    from psyche_solana.rpc import RpcError, SolanaRpc

    async def main() -> list[JoinableRun]:
        async with SolanaRpc(rpc_urls, retries=2) as rpc:
            return await find_joinable_runs(rpc, user, join_authority, delegate)

    try:
        candidates = asyncio.run(main())
    except (RpcError, AccountDecodeError) as error:
        raise DiscoveryFailed(f"RUN_ID is not set and the runs could not be listed: {error}"
                              ) from None
    if not candidates:
        only = f" whose join authority is {join_authority}" if join_authority else ""
        raise NoJoinableRun(f"RUN_ID is not set and no run{only} of coordinator program "
                            f"{coordinator_program()} is open to wallet {user} (running, "
                            "with a join authorization for it): set RUN_ID, or see list-runs "
                            "and can-join")
    return candidates[0], candidates
