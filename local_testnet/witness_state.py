"""Each testnet client's part in the current round's witnessing, in a word or two.

    RoundTrain, RoundWitness   "witness: sent" / "witness: waiting" for the elected
                               witnesses (whether the coordinator has their witness yet),
                               "trainer" for the others
    Warmup                     "warm-up: sent" once its warm-up witness is in, else "warm-up"
    a client out of the epoch  its state ("dropped", "withdrawn") or "not in epoch"
    other phases               "" (no round to witness)

From the coordinator state the testnet's observer receives: no client is asked anything.
"""

from __future__ import annotations

from coordinator import (
    CoordinatorState,
    NodeIdentity,
    RunState,
    SelectionError,
    selection_for_round,
)


def witness_states(state: CoordinatorState | None, keys: dict[int, bytes]) -> dict[int, str]:
    """Testnet client number -> its witness state; `keys`: each client's public key."""
    if state is None:
        return dict.fromkeys(keys, "")
    run_state = state.run_state
    if run_state not in (RunState.Warmup, RunState.RoundTrain, RunState.RoundWitness):
        return dict.fromkeys(keys, "")
    sent = {witness.proof.index for witness in state.current_round.witnesses}
    elected: set[int] = set()
    if run_state is not RunState.Warmup:
        try:
            elected = set(selection_for_round(state).witness_indices())
        except SelectionError:
            elected = set()  # a round the state cannot elect in: say nothing of it
    return {number: _one(state, NodeIdentity(key), sent, elected)
            for number, key in keys.items()}


def _one(state: CoordinatorState, node: NodeIdentity, sent: set[int], elected: set[int]) -> str:
    index = state.index_of(node)
    if index is None:
        return "not in epoch"
    listed = state.epoch_state.clients[index]
    if listed.state.name != "Healthy":
        return listed.state.name.lower()
    if state.run_state is RunState.Warmup:
        return "warm-up: sent" if index in sent else "warm-up"
    if index in elected:
        return "witness: sent" if index in sent else "witness: waiting"
    return "trainer"
