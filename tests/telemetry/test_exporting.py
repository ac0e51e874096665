"""Exporting in-process: undeliverable telemetry is dropped with a warning, never blocks;
instruments come from the registry; the Prometheus endpoint and the OTLP exporter
carry the resource; the coordinator and run-manager adapters count what happens."""

from __future__ import annotations

import copy
import logging
import math
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from loopback import free_port
from prometheus_client.parser import text_string_to_metric_families
from telemetry_helpers import OtlpReceiver, attributes

from coordinator import Coordinator, RunState, load_state_file
from coordinator_tcp.server import CoordinatorServer, ServerOptions
from coordinator_tcp.telemetry import CoordinatorTelemetry
from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions
from run_manager.docker_supervisor import (
    ContainerExited,
    ContainerStarted,
    RestartScheduled,
    SupervisorFinished,
)
from run_manager.telemetry import RunManagerTelemetry

TESTNET_STATE = Path(__file__).resolve().parents[2] / "config" / "local-testnet" / "state.toml"


def scrape(telemetry: Telemetry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    assert telemetry.prometheus is not None
    text = httpx.get(f"http://127.0.0.1:{telemetry.prometheus.port}/metrics", timeout=5).text
    return {(s.name, frozenset((k, v) for k, v in s.labels.items()
                               if k not in ("run_id", "service_name", "service_instance_id"))):
            s.value for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port that accepts TCP connections (kernel backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


def exercise(telemetry: Telemetry, iterations: int) -> float:
    """What the training path does with telemetry; returns the slowest call (s)."""
    slowest = 0.0
    for step in range(iterations):
        started = time.perf_counter()
        telemetry.gauge("psyche_last_train_time_seconds").set(0.1)
        telemetry.counter("psyche_total_tokens").add(128)
        with telemetry.span("train", step=step):
            pass
        telemetry.log_event("trained", {"step": step, "loss": 2.5})
        slowest = max(slowest, time.perf_counter() - started)
    return slowest


@pytest.mark.parametrize("destination", ["dead", "blackhole"])
def test_undeliverable_telemetry_is_dropped_with_one_warning(
        destination: str, blackhole: int, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port() if destination == "dead" else blackhole
    base = f"http://127.0.0.1:{port}"
    options = TelemetryOptions(metrics_url=f"{base}/v1/metrics", tracing_url=f"{base}/v1/traces",
                               logs_url=f"{base}/v1/logs", report_interval_s=0.2,
                               export_timeout_s=2.0)
    caplog.set_level(logging.WARNING, logger="psyche_common.telemetry")
    telemetry = Telemetry.start(options, ServiceIdentity("client", "ab" * 32, "run"))
    try:
        slowest = exercise(telemetry, 100)
        time.sleep(1.0)  # several export attempts on the background threads
        slowest = max(slowest, exercise(telemetry, 100))
        # An export waiting on the blackhole takes the full 2 s timeout; a training-path
        # call that waited for it would show it (the margin absorbs a busy machine).
        assert slowest < 1.0, f"a telemetry call blocked for {slowest:.3f} s"
        telemetry.flush(timeout_s=2)
    finally:
        started = time.monotonic()
        telemetry.shutdown()
        assert time.monotonic() - started < 10, "shutdown must be bounded by the export timeouts"
    warnings = [r.getMessage() for r in caplog.records if "cannot export" in r.getMessage()]
    for signal in ("metrics", "traces", "logs"):
        mine = [w for w in warnings if f"cannot export {signal} to {base}" in w]
        assert len(mine) == 1, warnings  # one per failure streak, not one per batch


def test_otlp_export_carries_resource_and_header_and_recovers(
        caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    options = TelemetryOptions(metrics_url=f"http://127.0.0.1:{port}/v1/metrics",
                               tracing_url=f"http://127.0.0.1:{port}/v1/traces",
                               auth_header="X-Scope-OrgID=ops", report_interval_s=0.2,
                               export_timeout_s=0.5)
    caplog.set_level(logging.WARNING, logger="psyche_common.telemetry")
    telemetry = Telemetry.start(options, ServiceIdentity("coordinator", "server", "run-7", "v9"))
    try:
        telemetry.gauge("psyche_coordinator_step").set(3)
        time.sleep(0.5)  # nobody listens yet: dropped
        with OtlpReceiver(port) as receiver:  # the collector comes up: exports resume
            telemetry.gauge("psyche_coordinator_step").set(4)
            with telemetry.span("tick", step=4):
                pass
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not receiver.metrics():
                time.sleep(0.1)
            telemetry.flush()
            requests = receiver.metrics()
            assert requests and receiver.traces()
            resource = attributes(requests[-1].resource_metrics[0].resource.attributes)
            assert resource["service.name"] == "psyche-coordinator"
            assert resource["service.instance.id"] == "server"
            assert resource["run.id"] == "run-7" and resource["service.version"] == "v9"
            assert resource["service.namespace"] == "psyche"
            metric = requests[-1].resource_metrics[0].scope_metrics[0].metrics[0]
            assert metric.name == "psyche_coordinator_step"
            assert metric.gauge.data_points[0].as_int == 4
            assert all(h["x-scope-orgid"] == "ops" for h in receiver.headers("/v1/metrics"))
            span = receiver.traces()[0].resource_spans[0].scope_spans[0].spans[0]
            assert span.name == "tick" and attributes(span.attributes) == {"psyche.step": 4}
    finally:
        telemetry.shutdown()
    messages = [r.getMessage() for r in caplog.records]
    assert any("cannot export metrics" in m for m in messages)
    assert any("works again" in m for m in messages)


def test_a_failing_or_non_finite_reading_is_skipped_not_fatal(
        caplog: pytest.LogCaptureFixture) -> None:
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("client", "cd" * 32, "run"))
    try:
        def broken() -> list[tuple[float, dict[str, str]]]:
            raise RuntimeError("bug in a reader")

        telemetry.observe("psyche_gossip_neighbors", broken)
        telemetry.observe("psyche_training_loss", lambda: [(math.nan, {})])
        telemetry.observe("psyche_round_step", lambda: [(7.0, {})])
        with caplog.at_level(logging.WARNING, logger="psyche_common.telemetry.core"):
            series = scrape(telemetry)
        assert series[("psyche_round_step", frozenset())] == 7.0
        assert not any(name == "psyche_training_loss" for name, _ in series)
        assert any("psyche_gossip_neighbors" in r.getMessage() for r in caplog.records)
        with pytest.raises(KeyError, match=r"names\.py"):
            telemetry.gauge("psyche_no_such_metric")
        with pytest.raises(TypeError, match="observable_gauge"):
            telemetry.gauge("psyche_round_step")
    finally:
        telemetry.shutdown()


def test_a_taken_prometheus_port_is_an_error_and_leaves_nothing_running() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with pytest.raises(OSError):
            Telemetry.start(TelemetryOptions(prometheus_port=port),
                            ServiceIdentity("coordinator", "server"))


def test_coordinator_metrics_follow_published_states() -> None:
    coordinator = Coordinator.from_state_file(load_state_file(TESTNET_STATE))
    server = CoordinatorServer(coordinator, ServerOptions(port=0))
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("coordinator", "server", "local-testnet"))
    try:
        CoordinatorTelemetry(telemetry, server)
        state = copy.deepcopy(server.state)
        for run_state, step in [(RunState.Warmup, 1), (RunState.RoundTrain, 1),
                                (RunState.RoundWitness, 1), (RunState.RoundTrain, 2),
                                (RunState.Cooldown, 3)]:
            state.run_state, state.progress.step = run_state, step
            for callback in server.on_change:
                callback(state)
            if (run_state, step) == (RunState.RoundTrain, 2):
                time.sleep(0.05)
        series = scrape(telemetry)
        assert series[("psyche_coordinator_step", frozenset())] == 3
        assert series[("psyche_coordinator_run_state", frozenset())] == int(RunState.Cooldown)
        assert series[("psyche_coordinator_state_changes_total", frozenset())] == 5
        assert series[("psyche_coordinator_epochs_finished_total", frozenset())] == 1
        assert series[("psyche_coordinator_clients", frozenset({("state", "Healthy")}))] == 0
        duration = series[("psyche_coordinator_round_duration_seconds", frozenset())]
        assert 0 < duration < 5  # RoundTrain(1) -> RoundTrain(2)
    finally:
        telemetry.shutdown()


def test_run_manager_counts_container_starts_exits_and_restarts() -> None:
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("run-manager", "wallet", "run"))
    passed_on: list[object] = []
    try:
        on_event = RunManagerTelemetry(telemetry).wrap(passed_on.append)
        events = [ContainerStarted("c1", "img:1", "1", 0), ContainerExited(1, 12.5),
                  RestartScheduled("crash", 1.0, 1), ContainerStarted("c2", "img:1", "1", 1),
                  ContainerExited(10, 3.0), RestartScheduled("version-change", 0.0, 0),
                  ContainerStarted("c3", "img:2", "2", 2)]
        for event in events:
            on_event(event)
        series = scrape(telemetry)
        assert passed_on == events
        assert series[("psyche_run_manager_container_starts_total", frozenset())] == 3
        assert series[("psyche_run_manager_container_running", frozenset())] == 1
        restarts = {dict(labels)["reason"]: value for (name, labels), value in series.items()
                    if name == "psyche_run_manager_container_restarts_total"}
        assert restarts == {"crash": 1, "version-change": 1}
        exits = {dict(labels)["exit_code"]: value for (name, labels), value in series.items()
                 if name == "psyche_run_manager_container_exits_total"}
        assert exits == {"1": 1, "10": 1}
        assert series[("psyche_run_manager_container_uptime_seconds", frozenset())] == 3.0
        on_event(SupervisorFinished("stopped", "bye"))
        assert scrape(telemetry)[("psyche_run_manager_container_running", frozenset())] == 0
        on_event("not an event")  # unknown things are passed on, not counted
        assert passed_on[-1] == "not an event"
    finally:
        telemetry.shutdown()
