"""The coordinator's verification reports and ejections in its telemetry, its TUI's status
and the run snapshot both TUIs show (a running round, reports via
`Coordinator.verification_report`)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tcp_helpers import make_state_file
from verification_round import report
from verification_round import running as running_round

from coordinator import ClientState, Coordinator
from coordinator.verification import plan_for_epoch
from coordinator_tcp.server import CoordinatorServer, ServerOptions
from coordinator_tcp.telemetry import CoordinatorTelemetry, ejected_clients
from coordinator_tcp.tui import CoordinatorApp
from psyche_common.run_view import ObservedState, build_snapshot
from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions


def running(clients: int = 4, percent: int = 50) -> Coordinator:
    return running_round(make_state_file(verification_percent=percent, min_clients=3,
                                         init_min_clients=clients, witness_nodes=0), clients)


def gauges(telemetry: Telemetry) -> dict[str, float]:
    assert telemetry.prometheus is not None
    text = httpx.get(f"http://127.0.0.1:{telemetry.prometheus.port}/metrics", timeout=5).text
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if not s.labels.keys() - {"run_id", "service_name",
                                                              "service_instance_id"}}


def test_reports_and_ejections_show_in_telemetry_tui_and_snapshot() -> None:
    coordinator = running()
    state = coordinator.state
    trainer, (first, second) = sorted(plan_for_epoch(state.epoch_state, 50).followers.items())[0]
    step = state.epoch_state.start_step
    server = CoordinatorServer(coordinator, ServerOptions(port=0))
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("coordinator", "server", "local-testnet"))
    try:
        CoordinatorTelemetry(telemetry, server)
        app = CoordinatorApp(server)
        series = gauges(telemetry)
        assert series["psyche_coordinator_verification_reports"] == 0
        assert series["psyche_coordinator_ejected_clients"] == 0
        assert app.verification_text() == "verification 50%   reports 0 this epoch   ejected 0"

        assert coordinator.verification_report(first, report(first, trainer, step)) is None
        for callback in server.on_change:
            callback(state)
        series = gauges(telemetry)
        assert series["psyche_coordinator_verification_reports"] == 1
        assert series["psyche_coordinator_ejected_clients"] == 0

        assert coordinator.verification_report(second, report(second, trainer, step + 1)) is None
        for callback in server.on_change:
            callback(state)
        series = gauges(telemetry)
        assert series["psyche_coordinator_verification_reports"] == 2
        assert series["psyche_coordinator_ejected_clients"] == 1
        assert [c.id for c in ejected_clients(state)] == [trainer]
        status = app.verification_text()
        assert (f"verification 50%   reports 2 this epoch   ejected 1 "
                f"({trainer.key.hex()[:16]})") in status, status

        # the run snapshot (both TUIs, the run-manager) carries the evidence
        snapshot = build_snapshot(ObservedState(state, 0, 0.0, 0))
        verification = snapshot.verification
        assert verification.percent == 50 and verification.ejected == [trainer.key.hex()]
        assert [(r.reporter, r.accused, r.step) for r in verification.reports] == [
            (first.key.hex(), trainer.key.hex(), step),
            (second.key.hex(), trainer.key.hex(), step + 1)]
        assert (verification.reports[0].jaccard, verification.reports[0].hamming,
                verification.reports[0].manhattan) == (0.31, 0.48, 1.2)
        ejected = [c for c in snapshot.clients if c.id == trainer.key.hex()]
        assert [c.state for c in ejected] == [ClientState.Ejected.name]
    finally:
        telemetry.shutdown()


def test_no_verification_line_while_the_run_does_not_verify() -> None:
    coordinator = running(percent=0)
    app = CoordinatorApp(CoordinatorServer(coordinator, ServerOptions(port=0)))
    assert app.verification_text() == ""
    assert build_snapshot(ObservedState(coordinator.state, 0, 0.0, 0)).verification.percent == 0
