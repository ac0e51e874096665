"""A lost model (no client holding the newer model came back: the run waits) and a model
reset (the operator accepted the loss, the run went back to the stored checkpoint) show in
the coordinator's state, its telemetry, its TUI's status and the run snapshot both TUIs
and the run-manager show."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tcp_helpers import make_state_file

from coordinator import Coordinator, NodeIdentity, RunState
from coordinator.config import HubCheckpoint, P2PCheckpoint
from coordinator_tcp.server import CoordinatorServer, ServerOptions
from coordinator_tcp.telemetry import CoordinatorTelemetry
from coordinator_tcp.tui import CoordinatorApp
from psyche_common.run_view import ObservedState, build_snapshot
from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions
from psyche_common.ui.view import MODEL_LOST, describe_run


def gauge(telemetry: Telemetry, name: str) -> float:
    assert telemetry.prometheus is not None
    text = httpx.get(f"http://127.0.0.1:{telemetry.prometheus.port}/metrics", timeout=5).text
    return next(s.value for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == name)


def model_resets_gauge(telemetry: Telemetry) -> float:
    return gauge(telemetry, "psyche_coordinator_model_resets")


def test_a_model_reset_shows_in_state_telemetry_tui_and_snapshot() -> None:
    coordinator = Coordinator.from_state_file(make_state_file(init_min_clients=2))
    state = coordinator.state
    # The last epoch's clients held the model (P2P), none of them is back, and it had
    # trained past its first round (its model moved on from the stored one).
    state.model = state.model.model_copy(update={
        "checkpoint": P2PCheckpoint(repo_id="assets/tiny-llama")})
    state.model_ahead = True
    server = CoordinatorServer(coordinator, ServerOptions(port=0))
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("coordinator", "server", "local-testnet"))
    try:
        CoordinatorTelemetry(telemetry, server)
        app = CoordinatorApp(server)
        assert model_resets_gauge(telemetry) == 0
        assert app.model_reset_text() == ""
        assert gauge(telemetry, "psyche_coordinator_model_lost") == 0
        newcomers = [NodeIdentity(bytes([i]) * 32) for i in (7, 8)]
        coordinator.tick(newcomers, 100, 1)
        assert state.run_state is RunState.WaitingForMembers and state.model_lost
        for callback in server.on_change:
            callback(state)
        assert gauge(telemetry, "psyche_coordinator_model_lost") == 1
        assert app.model_reset_text() == MODEL_LOST
        assert MODEL_LOST in describe_run(build_snapshot(ObservedState(state, 0, 0.0, 0)))
        assert coordinator.accept_model_loss() is None  # the operator's decision
        coordinator.tick(newcomers, 101, 1)
        assert state.run_state is RunState.Warmup
        assert isinstance(state.model.checkpoint, HubCheckpoint)
        assert state.model_resets == 1 and not state.model_lost
        for callback in server.on_change:
            callback(state)
        assert model_resets_gauge(telemetry) == 1
        assert gauge(telemetry, "psyche_coordinator_model_lost") == 0
        line = ("MODEL RESET 1 time: an epoch went back to the stored checkpoint, no client "
                "holding the newer model came back")
        assert app.model_reset_text() == line  # a line of the status (status_text)
        snapshot = build_snapshot(ObservedState(state, 0, 0.0, 0))
        assert snapshot.model_resets == 1 and not snapshot.model_lost
        assert describe_run(snapshot)[-1] == line
    finally:
        telemetry.shutdown()
