"""A plain summary of a coordinator state for the TUIs (server and testnet) and logs.

`summarize(state, now, connected)` says what a person watching the run wants to know:
the phase and how long until its timeout, epoch, step, the clients, and this round's
witnesses against the quorum. No Textual here, so it is cheap to test and reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator import CoordinatorState, RunState, witness_quorum


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
    phase_elapsed_s: int
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

    @property
    def phase_timer(self) -> str:
        if self.phase_timeout_s is None:
            return f"{self.phase_elapsed_s}s"
        return f"{self.phase_elapsed_s}s / {self.phase_timeout_s}s"


def _phase_timeout(state: CoordinatorState) -> int | None:
    config = state.config
    return {
        RunState.WaitingForMembers: config.waiting_for_members_extra_time,
        RunState.Warmup: config.warmup_time,
        RunState.RoundTrain: config.max_round_train_time,
        RunState.RoundWitness: config.round_witness_time,
        RunState.Cooldown: config.cooldown_time,
    }.get(state.run_state)


def summarize(state: CoordinatorState, now: int,
              connected: set[bytes] | frozenset[bytes] = frozenset()) -> StateSummary:
    clients = state.epoch_state.clients
    witnesses = len(state.current_round.witnesses) if state.run_state.active else 0
    target = state.config.witness_count(len(clients))
    return StateSummary(
        run_id=state.run_id,
        phase=state.run_state.name,
        phase_elapsed_s=max(0, now - state.run_state_start_unix_timestamp),
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
    )
