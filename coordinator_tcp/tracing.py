"""The TCP coordinator's spans: a tick that changes the run's state, a client's join, a witness.

    server.tracing = CoordinatorTracing(telemetry.tracer)   # CoordinatorTelemetry does this

The server marks where each starts and hands the outcome over when it is done
(`tick_started`/`tick_done`, `join_started`/`joined`, `event_started`/`witnessed`); a span is
made then, with the start time it was given, so the server's code stays as it is (no
block to indent) and a tick that changed nothing makes no span at all (the server ticks
every 100 ms to 1 s: a span per idle tick would bury the ones that matter). Spans go
wherever the program's telemetry sends them (OTLP/HTTP with --otlp-tracing-url), as
the client's do.

  coordinator.tick     psyche.run_state (after), psyche.from_run_state, psyche.epoch,
                       psyche.step, psyche.clients, psyche.result ("ok" or the
                       coordinator's refusal); one per tick whose phase, epoch, step or
                       client count changed
  coordinator.join     psyche.client (node id hex), psyche.p2p_address, psyche.run_state,
                       psyche.listed (in the epoch's client list), psyche.pending (clients
                       asking to take part)
  coordinator.witness  psyche.client, psyche.kind ("round" or "warmup"), psyche.run_state,
                       psyche.epoch, psyche.step, psyche.accepted, psyche.error (a refusal's
                       name), psyche.witnesses (the round's witnesses after it); status
                       ERROR when refused

Without telemetry the server holds NO_TRACING, whose calls do nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordinator import CoordinatorState, Rejected, RunState
from coordinator.messages import RoundWitness, WarmupWitness

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


@dataclass(frozen=True)
class TickMark:
    """What a tick started from: when, and the run's position then."""

    started_ns: int
    run_state: RunState
    epoch: int
    step: int
    clients: int


def position(state: CoordinatorState) -> tuple[RunState, int, int, int]:
    return (state.run_state, state.progress.epoch, state.progress.step,
            len(state.epoch_state.clients))


class NoTracing:
    """The server's tracing when no telemetry runs: every call is a no-op."""

    def tick_started(self, state: CoordinatorState) -> TickMark | None:
        return None

    def tick_done(self, mark: TickMark | None, state: CoordinatorState, result: object) -> None:
        return None

    def now_ns(self) -> int:
        return 0

    def joined(self, started_ns: int, identity_hex: str, p2p_address: str,
               state: CoordinatorState, pending: int) -> None:
        return None

    def witnessed(self, started_ns: int, identity_hex: str, event: object,
                  rejected: Rejected | None, state: CoordinatorState) -> None:
        return None


NO_TRACING = NoTracing()


class CoordinatorTracing(NoTracing):
    def __init__(self, tracer: Tracer):
        self.tracer = tracer

    def now_ns(self) -> int:
        return time.time_ns()

    def _span(self, name: str, started_ns: int, attributes: dict[str, Any],
              error: str | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self.tracer.start_span(name, start_time=started_ns, attributes={
            f"psyche.{key}": value for key, value in attributes.items()})
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def tick_started(self, state: CoordinatorState) -> TickMark | None:
        return TickMark(time.time_ns(), *position(state))

    def tick_done(self, mark: TickMark | None, state: CoordinatorState, result: object) -> None:
        if mark is None:
            return
        before = (mark.run_state, mark.epoch, mark.step, mark.clients)
        if position(state) == before:
            return
        refused = result.error.name if isinstance(result, Rejected) else None
        self._span("coordinator.tick", mark.started_ns, {
            "run_state": state.run_state.name, "from_run_state": mark.run_state.name,
            "epoch": state.progress.epoch, "step": state.progress.step,
            "clients": len(state.epoch_state.clients), "result": refused or "ok"})

    def joined(self, started_ns: int, identity_hex: str, p2p_address: str,
               state: CoordinatorState, pending: int) -> None:
        listed = any(c.id.key.hex() == identity_hex for c in state.epoch_state.clients)
        self._span("coordinator.join", started_ns, {
            "client": identity_hex, "p2p_address": p2p_address,
            "run_state": state.run_state.name, "listed": listed, "pending": pending})

    def witnessed(self, started_ns: int, identity_hex: str, event: object,
                  rejected: Rejected | None, state: CoordinatorState) -> None:
        """A client's event was applied: a span if it was a witness (others make none)."""
        if not isinstance(event, RoundWitness | WarmupWitness):
            return
        error = rejected.error.name if rejected is not None else None
        attributes: dict[str, Any] = {
            "client": identity_hex,
            "kind": "round" if isinstance(event, RoundWitness) else "warmup",
            "run_state": state.run_state.name, "epoch": state.progress.epoch,
            "step": state.progress.step, "accepted": rejected is None,
            "witnesses": len(state.current_round.witnesses)}
        if error is not None:
            attributes["error"] = error
        self._span("coordinator.witness", started_ns, attributes,
                   error=None if rejected is None else str(rejected))
