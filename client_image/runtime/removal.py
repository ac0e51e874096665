"""Why the coordinator took this client out of the run, told to its operator.

The coordinator's state records only *how* a client left (its `ClientState`: Dropped by a
health check, Withdrawn) and *when* (`exited_height`); adding the reason to the state would
change the state every backend serializes (TCP and the Solana program's account). So the
client infers the reason from the state it sees plus what only it knows (how long its own
training took, whether it was an elected witness):

    late-witness        every client was withdrawn at height 0: no witness of the epoch's
                        first round reached the coordinator before the witness time ran
                        out, so it cannot tell who trained (coordinator/machine.py)
    training-over-time  dropped by a health check, and this client's last training step
                        took longer than the round's `max_round_train_time`: its result
                        reached the witnesses after they had vouched
    health-check        dropped by a health check: the round's witnesses did not receive
                        this client's result (a network or P2P problem, not slowness)
    paused              withdrawn because the run's authority paused the run
    withdrawn           withdrawn otherwise: it left, or lost its coordinator connection

`RemovalWatch` follows the states and the client's own events and emits one `Removed`
event per removal (the log, the metrics, the client's TUI and, through the metrics, the
run-manager's TUI show it).
"""

from __future__ import annotations

from client_image.runtime.events import Removed, RuntimeEvent, Trained
from client_image.runtime.observability import EventLog
from client_image.runtime.rounds import my_witness_proof
from coordinator import ClientState, CoordinatorState, NodeIdentity, RunState, SelectionError
from coordinator.state import Client


def removal_reason(state: CoordinatorState, me: NodeIdentity,
                   last_train_s: float | None) -> Removed | None:
    """The `Removed` event this state means for `me`, or None while `me` is healthy or
    not in the epoch at all."""
    mine = _entry(state, me)
    if mine is None or mine.state is ClientState.Healthy:
        return None
    epoch, step = state.progress.epoch, state.progress.step
    limit = state.config.max_round_train_time
    if mine.state is ClientState.Dropped:
        if last_train_s is not None and last_train_s > limit:
            return Removed(epoch, step, "training-over-time",
                           f"its last training step took {last_train_s:.1f} s, over the "
                           f"round's {limit} s: its result reached the witnesses too late, "
                           "and a health check dropped it")
        return Removed(epoch, step, "health-check",
                       "a health check dropped it: the round's witnesses did not receive "
                       "its result")
    if mine.state is ClientState.Ejected:
        return None  # told by the verification duty's own `Ejected` event
    if state.run_state is RunState.Paused:
        return Removed(epoch, step, "paused",
                       "the run was paused: every client was withdrawn")
    if mine.exited_height == 0 and _everyone_withdrawn(state):
        own = (" (this client was one of that round's witnesses)"
               if _was_witness(state, me) else "")
        return Removed(epoch, step, "late-witness",
                       "no witness of the epoch's first round arrived before the witness "
                       f"time ran out{own}: the coordinator withdrew every client")
    return Removed(epoch, step, "withdrawn",
                   "withdrawn: this client left the run or lost its coordinator connection")


def _entry(state: CoordinatorState, me: NodeIdentity) -> Client | None:
    epoch = state.epoch_state
    for client in (*epoch.clients, *epoch.exited_clients):
        if client.id == me:
            return client
    return None


def _everyone_withdrawn(state: CoordinatorState) -> bool:
    epoch = state.epoch_state
    everyone = [*epoch.clients, *(c for c in epoch.exited_clients if c.exited_height == 0)]
    return bool(everyone) and all(c.state is ClientState.Withdrawn for c in everyone)


def _was_witness(state: CoordinatorState, me: NodeIdentity) -> bool:
    try:
        proof = my_witness_proof(state, me)
    except SelectionError:
        return False
    return proof is not None and proof[2]


class RemovalWatch:
    """Emits `Removed` once per removal: listens to the client's events (its training
    times) and is shown every coordinator state (`notice`)."""

    def __init__(self, me: NodeIdentity, events: EventLog) -> None:
        self.me = me
        self.events = events
        self.last_train_s: float | None = None
        self.told: tuple[int, int] | None = None  # the epoch whose removal was told
        events.listeners.append(self.observe)

    def observe(self, event: RuntimeEvent) -> None:
        if isinstance(event, Trained):
            # Waiting for the batch counts: the round's time limit does not wait for data.
            self.last_train_s = event.seconds + event.data_wait_s

    def notice(self, state: CoordinatorState) -> None:
        # The entry stays in the state until the next warm-up replaces the epoch's state
        # (the epoch number moves before, at cooldown's end): one event per epoch state,
        # known by its start.
        epoch = (state.epoch_state.start_step, state.epoch_state.start_timestamp)
        if self.told == epoch:
            return
        removed = removal_reason(state, self.me, self.last_train_s)
        if removed is not None:
            self.told = epoch
            self.events.emit(removed)
