"""Who the server counts in: the connected clients a tick is given, and whose p2p
addresses the clients need. Pure functions of the coordinator's state and the connected
clients (in join order)."""

from __future__ import annotations

from collections.abc import Collection

from coordinator import ClientState, CoordinatorState, NodeIdentity, RunState


def pending_clients(state: CoordinatorState,
                    connected: Collection[NodeIdentity]) -> list[NodeIdentity]:
    """Connected clients asking to take part, in join order.

    As in Psyche, clients the coordinator removed this epoch (Dropped by a health check,
    Ejected) are left out, so a faulty client sits out one epoch. Clients that were
    Withdrawn (they left or their connection dropped) and came back are welcome. And when
    leaving the removed ones out would keep the run from ever starting (fewer than
    init_min_clients otherwise), they are let in too: liveness first.
    """
    removed = {c.id for c in state.epoch_state.exited_clients
               if c.state in (ClientState.Dropped, ClientState.Ejected)}
    preferred = [node for node in connected if node not in removed]
    if (state.run_state is RunState.WaitingForMembers
            and len(preferred) < state.config.init_min_clients <= len(connected)):
        return list(connected)
    return preferred


def needed_addresses(state: CoordinatorState, connected: Collection[NodeIdentity]) -> set[str]:
    """Whose addresses (hex keys) the clients need: those connected (asking to take part)
    and the epoch's, listed and exited. The rest (clients that left) are dropped."""
    epoch = state.epoch_state
    return {*(node.key.hex() for node in connected),
            *(client.id.key.hex() for client in epoch.clients),
            *(client.id.key.hex() for client in epoch.exited_clients)}
