"""Why a connected client is not in the epoch, and what it waits for.

The server tells each client left out of the epoch (`Notice`): the epoch is full (Psyche
caps it at `MAX_CLIENTS`) or started before it joined; and, once it is in, that it takes
part. `waiting_notices` says what each peer should be told about the current state, only
where it differs from the last notice that peer got.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from coordinator import MAX_CLIENTS, CoordinatorState, NodeIdentity, RunState
from coordinator_tcp.protocol import NoticeCode
from coordinator_tcp.server_parts import _Peer

_TRAINING = (RunState.Warmup, RunState.RoundTrain, RunState.RoundWitness, RunState.Cooldown)


def waiting_notices(state: CoordinatorState, pending: list[NodeIdentity],
                    peers: Iterable[_Peer]) -> Iterator[tuple[_Peer, NoticeCode, str]]:
    """(peer, code, text) for each of `peers` with something new to be told (a notice
    other than the last it got); `pending` are the clients asking to take part, in join
    order."""
    run_state = state.run_state
    if run_state is RunState.WaitingForMembers:
        positions = {node: i for i, node in enumerate(pending)}
        for peer in peers:
            position = positions.get(peer.identity)
            if position is not None and position >= MAX_CLIENTS and peer.notice != "epoch_full":
                yield peer, "epoch_full", (
                    f"the epoch is full ({MAX_CLIENTS} clients): waiting for the next one "
                    f"({position} clients joined before this one)")
        return
    if run_state not in _TRAINING:
        return  # paused, finished: the state says what the run waits for
    listed = {client.id for client in state.epoch_state.clients}
    # The same words for every waiting peer: made once per state, not once per peer.
    left_out: tuple[NoticeCode, str] = (
        ("epoch_full", f"the epoch is full ({MAX_CLIENTS} clients): waiting for the next one")
        if len(listed) >= MAX_CLIENTS else
        ("epoch_started", f"the epoch started before this client joined ({run_state.name}, "
                          f"{len(listed)} clients): waiting for the next one"))
    for peer in peers:
        if peer.identity in listed:
            if peer.notice is not None and peer.notice != "taking_part":
                yield peer, "taking_part", "taking part in the epoch"
        elif peer.notice != left_out[0]:
            yield peer, *left_out
