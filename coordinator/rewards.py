"""Reward points per epoch (docs/coordinator.md, "Rewards").

On every epoch end (successful or not, as in Psyche) each Healthy client of the epoch
earns  earning_rate_total_shared // len(clients); exited Ejected clients are charged
slashing_rate_per_client. Rates set for the future apply from the next warm-up.
The ledger holds at most 256 clients; later newcomers are not credited.
"""

from __future__ import annotations

from coordinator.limits import MAX_CLIENTS, ClientState
from coordinator.state import EpochState, NodeIdentity, RewardEntry, Rewards


def start_epoch_rates(rewards: Rewards) -> None:
    rewards.current_earning_rate_total_shared = rewards.future_earning_rate_total_shared
    rewards.current_slashing_rate_per_client = rewards.future_slashing_rate_per_client


def set_future_rates(rewards: Rewards, earning_rate_total_shared: int | None = None,
                     slashing_rate_per_client: int | None = None) -> None:
    if earning_rate_total_shared is not None:
        rewards.future_earning_rate_total_shared = earning_rate_total_shared
    if slashing_rate_per_client is not None:
        rewards.future_slashing_rate_per_client = slashing_rate_per_client


def _entry(rewards: Rewards, node: NodeIdentity) -> RewardEntry | None:
    for entry in rewards.entries:
        if entry.id == node:
            return entry
    if len(rewards.entries) >= MAX_CLIENTS:
        return None
    entry = RewardEntry(node)
    rewards.entries.append(entry)
    return entry


def credit_epoch(rewards: Rewards, epoch: EpochState) -> None:
    if epoch.clients:
        share = rewards.current_earning_rate_total_shared // len(epoch.clients)
        for client in epoch.clients:
            if client.state is ClientState.Healthy:
                entry = _entry(rewards, client.id)
                if entry is not None:
                    entry.earned = min(entry.earned + share, 2**64 - 1)
    for client in epoch.exited_clients:
        if client.state is ClientState.Ejected:
            entry = _entry(rewards, client.id)
            if entry is not None:
                entry.slashed = min(entry.slashed + rewards.current_slashing_rate_per_client,
                                    2**64 - 1)


def earned_points(rewards: Rewards, node: NodeIdentity) -> int:
    return next((entry.earned for entry in rewards.entries if entry.id == node), 0)
