"""The TCP coordinator server's telemetry, taken from each state it publishes.

`CoordinatorTelemetry(telemetry, server)` subscribes to `server.on_change` (called by
`_publish_if_changed` after every broadcast) and sets the gauges from the new state:
phase, epoch, step, clients by state, witnesses and quorum of the current round, and
the epoch's verification reports and ejected clients; and how long each phase lasted
(`psyche_coordinator_phase_duration_seconds{phase=RunState name}`, set when it ends);
and it gives the server its spans (coordinator_tcp/tracing.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from coordinator import Client, ClientState, CoordinatorState, RunState, witness_quorum
from coordinator_tcp.tracing import CoordinatorTracing

if TYPE_CHECKING:  # the TUI imports ejected_clients without the OpenTelemetry SDK
    from coordinator_tcp.server import CoordinatorServer
    from psyche_common.telemetry.core import Telemetry


def ejected_clients(state: CoordinatorState) -> list[Client]:
    """The epoch's clients ejected by their followers' reports (docs/verification.md): still
    listed until the next round starts, then among the exited clients."""
    epoch = state.epoch_state
    return [c for c in (*epoch.clients, *epoch.exited_clients) if c.state is ClientState.Ejected]


class CoordinatorTelemetry:
    def __init__(self, telemetry: Telemetry, server: CoordinatorServer):
        self.telemetry = telemetry
        self.server = server
        self._previous: CoordinatorState | None = None
        self._phase: RunState | None = None
        self._step: int | None = None
        self._last_round_start: float | None = None
        self._phase_start: float | None = None  # None: the first state, seen mid-phase
        server.on_change.append(self.on_state)
        server.tracing = CoordinatorTracing(telemetry.tracer)  # ticks, joins, witnesses
        self.on_state(server.state, count_change=False)

    def on_state(self, state: CoordinatorState, count_change: bool = True) -> None:
        t = self.telemetry
        if count_change:
            t.counter("psyche_coordinator_state_changes").add(1)
        t.gauge("psyche_coordinator_run_state").set(int(state.run_state))
        t.gauge("psyche_coordinator_epoch").set(state.progress.epoch)
        t.gauge("psyche_coordinator_step").set(state.progress.step)
        clients = state.epoch_state.clients
        for client_state in ClientState:
            count = sum(1 for c in clients if c.state is client_state)
            t.gauge("psyche_coordinator_clients").set(count, {"state": client_state.name})
        t.gauge("psyche_coordinator_connected_clients").set(len(self.server.peers))
        t.gauge("psyche_coordinator_witnesses").set(len(state.current_round.witnesses))
        target = state.config.witness_count(len(clients)) if clients else 0
        t.gauge("psyche_coordinator_witness_quorum").set(witness_quorum(target))
        epoch = state.epoch_state
        t.gauge("psyche_coordinator_verification_reports").set(len(epoch.reports))
        t.gauge("psyche_coordinator_ejected_clients").set(len(ejected_clients(state)))
        t.gauge("psyche_coordinator_model_resets").set(state.model_resets)
        t.gauge("psyche_coordinator_model_lost").set(int(state.model_lost))

        entering = state.run_state is not self._phase
        new_round = state.run_state is RunState.RoundTrain and (
            entering or state.progress.step != self._step)
        if entering or new_round:
            self._end_phase(count_change)
        if new_round:
            # A round lasts from its RoundTrain to the next one; after Warmup or
            # Cooldown there was no previous round in this epoch to time.
            now = time.monotonic()
            came_from_round = self._phase in (RunState.RoundTrain, RunState.RoundWitness)
            if self._last_round_start is not None and came_from_round:
                t.gauge("psyche_coordinator_round_duration_seconds").set(
                    now - self._last_round_start)
            self._last_round_start = now
        if entering and state.run_state is RunState.Cooldown:
            t.counter("psyche_coordinator_epochs_finished").add(1)
        self._phase, self._step = state.run_state, state.progress.step

    def _end_phase(self, timed: bool) -> None:
        """The phase that just ended: its duration, unless this server saw only its end."""
        now = time.monotonic()
        if timed and self._phase is not None and self._phase_start is not None:
            self.telemetry.gauge("psyche_coordinator_phase_duration_seconds").set(
                now - self._phase_start, {"phase": self._phase.name})
        self._phase_start = now if timed else None
