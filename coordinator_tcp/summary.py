"""A plain summary of a coordinator state for the TUIs (server and testnet) and logs.

`summarize(state, now, connected, joined, pending=, replay_classes=)` says what a person
watching the run wants to know: the phase and how long until its timeout, what the run
waits for (and who a verified epoch cannot list yet), epoch, step, the clients, and this
round's witnesses against the quorum. No Textual here, so it is cheap
to test and reuse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator import CoordinatorState, NodeIdentity, RunState, witness_quorum
from coordinator.verification import class_shortfalls
from psyche_common.run_view import phase_elapsed
from psyche_common.ui.view import describe_wait


@dataclass(frozen=True)
class ClientRow:
    index: int
    key_hex: str
    state: str
    connected: bool


@dataclass(frozen=True)
class StateSummary:
    run_id: str
    phase: str
    phase_elapsed_s: int | None  # None: no phase start in the state (a fresh run) to count from
    phase_timeout_s: int | None  # None: the phase waits for an event, not a timer
    epoch: int
    step: int
    total_steps: int
    height: int
    clients: list[ClientRow]
    witnesses: int
    witness_target: int
    quorum: int
    paused_pending: bool
    checkpoint: str
    init_min_clients: int = 0
    joined: int | None = None  # clients asking to take part; None: not known here
    warmup_ready: int = 0  # warm-up witnesses received (Warmup only)
    # how many more clients of its replay class each joiner a verified epoch cannot list
    # yet waits for (coordinator/verification.py class_shortfalls; WaitingForMembers only)
    class_shortfalls: tuple[int, ...] = ()

    @property
    def phase_timer(self) -> str:
        return phase_timer(self.phase_elapsed_s, self.phase_timeout_s)

    @property
    def waiting(self) -> str | None:
        """What the run waits for ("waiting for 3 clients, 2 connected"); None in a round."""
        return describe_wait(self.phase, init_min_clients=self.init_min_clients,
                             joined=self.joined, warmup_ready=self.warmup_ready,
                             warmup_target=self.witness_target,
                             class_shortfalls=self.class_shortfalls)


def phase_timer(elapsed_s: int | None, timeout_s: int | None) -> str:
    """"3s / 20s" (elapsed / the phase's time limit), "3s" with no limit; "—" for an
    elapsed time the state cannot tell (never a Unix time)."""
    elapsed = "—" if elapsed_s is None else f"{elapsed_s}s"
    return elapsed if timeout_s is None else f"{elapsed} / {timeout_s}s"


def _phase_timeout(state: CoordinatorState) -> int | None:
    config = state.config
    return {
        RunState.WaitingForMembers: config.waiting_for_members_extra_time,
        RunState.Warmup: config.warmup_time,
        RunState.RoundTrain: config.max_round_train_time,
        RunState.RoundWitness: config.round_witness_time,
        RunState.Cooldown: config.cooldown_time,
    }.get(state.run_state)


def summarize(state: CoordinatorState, now: float,
              connected: set[bytes] | frozenset[bytes] = frozenset(),
              joined: int | None = None, *, pending: Sequence[NodeIdentity] | None = None,
              replay_classes: Mapping[NodeIdentity, int] | None = None) -> StateSummary:
    """`now`: the coordinator's unix time; `connected`: keys of the connected clients;
    `joined`: how many connected clients ask to take part (CoordinatorServer.pending).
    `pending`: those clients themselves, with their `replay_classes`, where known: then
    `joined` defaults to how many they are, and the waiting line says who a verified epoch
    cannot list yet."""
    shortfalls: tuple[int, ...] = ()
    if pending is not None:
        joined = len(pending) if joined is None else joined
        if state.run_state is RunState.WaitingForMembers:
            short = class_shortfalls(pending, replay_classes or {},
                                     state.config.verification_percent)
            shortfalls = tuple(short[node] for node in pending if node in short)
    clients = state.epoch_state.clients
    witnesses = len(state.current_round.witnesses) if state.run_state.active else 0
    target = state.config.witness_count(len(clients))
    elapsed = phase_elapsed(state.run_state_start_unix_timestamp, now)
    return StateSummary(
        run_id=state.run_id,
        phase=state.run_state.name,
        phase_elapsed_s=None if elapsed is None else int(elapsed),
        phase_timeout_s=_phase_timeout(state),
        epoch=state.progress.epoch,
        step=state.progress.step,
        total_steps=state.config.total_steps,
        height=state.current_round.height,
        clients=[ClientRow(i, c.id.key.hex(), c.state.name, c.id.key in connected)
                 for i, c in enumerate(clients)],
        witnesses=witnesses,
        witness_target=target,
        quorum=witness_quorum(target),
        paused_pending=state.pending_pause,
        checkpoint=type(state.model.checkpoint).__name__,
        init_min_clients=state.config.init_min_clients,
        joined=joined,
        class_shortfalls=shortfalls,
        warmup_ready=(len(state.current_round.witnesses)
                      if state.run_state is RunState.Warmup else 0),
    )
