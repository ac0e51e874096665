"""The JSON of `run-manager json-dump-run` / `json-dump-user` (docs/solana.md,
"Run dumps")."""

from __future__ import annotations

from typing import Any

from solders.pubkey import Pubkey

from coordinator import ClientState
from psyche_solana.accounts import CoordinatorAccount, Participant
from psyche_solana.run_metadata import RunMetadata
from psyche_solana.runs import RunHandle


def run_json(run: RunHandle, metadata: RunMetadata | None = None) -> dict[str, Any]:
    """`metadata`: the run's, from its metadata PDA; None (never set) shows Psyche's
    default, empty one."""
    account: CoordinatorAccount = run.account
    state = account.state
    status: dict[str, Any] = {"next_active": account.next_active, "state": account.run_state.name}
    epoch: dict[str, Any] = {}
    clients: dict[str, Any] = {}
    accounting = {"max_active": len(account.registry), "sum_earned": 0, "sum_slashed": 0}
    setup: dict[str, Any] = {"client_version": account.client_version,
                             "metadata": (metadata or RunMetadata()).as_json(),
                             "config": account.raw_config if account.config_set else None,
                             "model": None}
    if state is not None:
        status.update(epoch=state.progress.epoch, step=state.progress.step)
        setup["model"] = state.model.model_dump(mode="json")
        epoch = {
            "clients": {
                "alive": [str(Pubkey(c.id.key)) for c in state.epoch_state.clients
                          if c.state is ClientState.Healthy],
                "exited": [str(Pubkey(c.id.key)) for c in state.epoch_state.exited_clients]},
            "rates": {
                "current": {"earning_rate_total_shared": state.rewards.current_earning_rate_total_shared,
                            "slashing_rate_per_client": state.rewards.current_slashing_rate_per_client},
                "future": {"earning_rate_total_shared": state.rewards.future_earning_rate_total_shared,
                           "slashing_rate_per_client": state.rewards.future_slashing_rate_per_client}}}
        for entry in state.rewards.entries:
            clients[str(Pubkey(entry.id.key))] = {"earned": entry.earned, "slashed": entry.slashed}
            accounting["sum_earned"] += entry.earned
            accounting["sum_slashed"] += entry.slashed
    for key, active in account.registry:
        clients.setdefault(str(key), {"earned": 0, "slashed": 0})["active"] = active
    treasurer = None
    if run.treasurer is not None:
        t = run.treasurer
        claimed = t.total_claimed_earned_points
        treasurer = {"index": t.index, "main_authority": str(t.main_authority),
                     "collateral_mint": str(t.collateral_mint),
                     "claimed_points": claimed,
                     "claimable_points": accounting["sum_earned"] - claimed,
                     "total_claimed_collateral_amount": t.total_claimed_collateral_amount}
    return {
        "coordinator_instance": {"address": str(run.instance),
                                 "join_authority": str(account.join_authority),
                                 "main_authority": str(account.main_authority)},
        "coordinator_account": {"address": str(run.address), "run_id": account.run_id,
                                "setup": setup, "status": status, "epoch": epoch,
                                "clients": clients, "accounting": accounting,
                                "nonce": account.nonce},
        "treasurer_run": treasurer,
    }


def user_json(run: RunHandle, user: Pubkey, lamports: int,
              participant: Participant | None) -> dict[str, Any]:
    state = run.account.state
    key = bytes(user)
    client = None
    alive = exited = False
    if state is not None:
        entry = next((e for e in state.rewards.entries if e.id.key == key), None)
        if entry is not None:
            client = {"earned": entry.earned, "slashed": entry.slashed}
        alive = any(c.id.key == key and c.state is ClientState.Healthy
                    for c in state.epoch_state.clients)
        exited = any(c.id.key == key for c in state.epoch_state.exited_clients)
    active = next((a for k, a in run.account.registry if k == user), None)
    return {"address": str(user), "lamports": lamports,
            "coordinator_account": {"client": client, "active": active,
                                    "epoch_alive": alive, "epoch_exited": exited},
            "treasurer_participant": None if participant is None else {
                "claimed_earned_points": participant.claimed_earned_points,
                "claimed_collateral_amount": participant.claimed_collateral_amount}}
