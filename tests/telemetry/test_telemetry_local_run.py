"""A short local run, watched the way an ops team watches one.

One module-scoped run: a real Prometheus scraping `psyche-coordinator run` and one
`psyche-client train` through their --prometheus-port endpoints, both also pushing
OTLP/HTTP to a receiver started here. The run is the local-testnet config cut to 8
steps and one client (~35 s on a busy 2-core machine). Then:
  * Prometheus has the expected series with plausible values (step rising, loss finite);
  * the OTLP metrics, spans (one per round phase) and logs arrived with the right
    resource attributes and the auth header;
  * every dashboard query is valid PromQL for this Prometheus, and the main panels
    have data.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from telemetry_helpers import (
    OtlpReceiver,
    PrometheusServer,
    attributes,
    free_port,
    metric_names_by_service,
)

from psyche_common.identity import Identity
from psyche_common.telemetry.names import CLIENT_METRICS, COORDINATOR_METRICS

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TESTNET = REPO / "config" / "local-testnet"
SECRET_HEX = "5a" * 32
RUN_ID = "local-testnet"
TOTAL_STEPS = 8


@dataclass
class LocalRun:
    prometheus: PrometheusServer
    receiver: OtlpReceiver
    node_id: str
    client_exit: int
    client_output: str


def write_config(directory: Path, data_port: int) -> tuple[Path, Path]:
    state = (TESTNET / "state.toml").read_text()
    state = state.replace("127.0.0.1:20001", f"127.0.0.1:{data_port}")
    state = state.replace("init_min_clients = 3", "init_min_clients = 1")
    state, replaced = re.subn(r"(?m)^total_steps = \d+$", f"total_steps = {TOTAL_STEPS}", state)
    assert replaced, "the testnet config no longer sets total_steps"
    (directory / "state.toml").write_text(state)
    data = (TESTNET / "data.toml").read_text().replace(
        "../../assets/data/train", str(REPO / "assets" / "data" / "train"))
    (directory / "data.toml").write_text(data)
    return directory / "state.toml", directory / "data.toml"


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRun]:
    work = tmp_path_factory.mktemp("local_run")
    server_port, data_port = free_port(), free_port()
    coordinator_metrics, client_metrics = free_port(), free_port()
    state, data = write_config(work, data_port)
    prometheus = PrometheusServer(work, {
        "coordinator": [f"127.0.0.1:{coordinator_metrics}"],
        "client": [f"127.0.0.1:{client_metrics}"]})
    prometheus.start()
    receiver = OtlpReceiver().__enter__()
    env = {**os.environ, "DEPLOYMENT_ENV": "telemetry-test", "PYTHONUNBUFFERED": "1"}
    env.pop("CLIENT_VERSION", None)
    # a file, not a pipe: a pipe nobody reads could fill up (the child keeps its own copy)
    with (work / "coordinator.log").open("w") as coordinator_log:
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state),
             "--data-config", str(data), "--server-port", str(server_port),
             "--bind-host", "127.0.0.1", "--tick-interval", "0.2",
             "--prometheus-port", str(coordinator_metrics),
             "--otlp-metrics-url", receiver.url("metrics"),
             "--otlp-logs-url", receiver.url("logs"), "--otlp-report-interval", "1"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=coordinator_log, text=True)
    client: subprocess.Popen[str] | None = None
    try:
        # The client starts once Prometheus has seen the coordinator waiting for members.
        deadline = time.monotonic() + 60
        while not prometheus.query('psyche_coordinator_run_state{job="coordinator"}')["result"]:
            assert time.monotonic() < deadline, "Prometheus never scraped the coordinator"
            assert coordinator.poll() is None, (work / "coordinator.log").read_text()[-2000:]
            time.sleep(0.3)
        client_env = {**env, "RAW_IDENTITY_SECRET_KEY": SECRET_HEX,
                      # Psyche's spelling, from the environment
                      "OLTP_LOGS_URL": receiver.url("logs")}
        client = subprocess.Popen(
            [sys.executable, "-m", "client_image.cli", "train", "--run-id", RUN_ID,
             "--server-addr", f"127.0.0.1:{server_port}", "--iroh-relay", "disabled",
             "--bind-p2p-interface", "127.0.0.1", "--torch-threads", "1",
             "--prometheus-port", str(client_metrics),
             "--otlp-metrics-url", receiver.url("metrics"),
             "--oltp-tracing-url", receiver.url("traces"),
             "--oltp-auth-header", "Authorization: Bearer test-token",
             "--otlp-report-interval", "1"],
            cwd=REPO, env=client_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        output, _ = client.communicate(timeout=240)
        time.sleep(1.5)  # one more coordinator scrape of the Finished state
        stop(coordinator)
        yield LocalRun(prometheus, receiver, Identity.from_hex(SECRET_HEX).node_id,
                       client.returncode, output)
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait(timeout=5)
        stop(coordinator)
        receiver.__exit__(None, None, None)
        prometheus.stop()


def test_client_finished_the_run(local_run: LocalRun) -> None:
    assert local_run.client_exit == 0, local_run.client_output[-3000:]
    assert "finished" in local_run.client_output


def test_prometheus_scraped_the_client_with_plausible_values(local_run: LocalRun) -> None:
    prometheus = local_run.prometheus
    steps = prometheus.samples('psyche_round_step{job="client"}')
    assert len(steps) == 1, steps
    labels, values = steps[0]
    assert labels["service_instance_id"] == local_run.node_id
    assert labels["run_id"] == RUN_ID and labels["service_name"] == "psyche-client"
    assert values == sorted(values), f"the step never goes back: {values}"
    assert values[0] < values[-1] and values[-1] >= TOTAL_STEPS - 2, values

    (_, losses), = prometheus.samples('psyche_training_loss{job="client"}')
    assert losses and all(math.isfinite(v) and 0 < v < 20 for v in losses), losses
    assert losses[-1] < losses[0], f"the loss went down over the run: {losses}"
    (_, tokens_per_s), = prometheus.samples('psyche_tokens_per_second{job="client"}')
    assert max(tokens_per_s) > 0
    (_, train_times), = prometheus.samples('psyche_last_train_time_seconds{job="client"}')
    assert all(0 < t < 60 for t in train_times)
    (_, tokens), = prometheus.samples('psyche_total_tokens_total{job="client"}')
    # global batch 12 sequences of max_seq_len 128, all trained by the one client
    assert tokens[-1] > 0 and all(t % (12 * 128) == 0 for t in tokens), tokens
    (_, batch_tokens), = prometheus.samples('psyche_token_batch_size{job="client"}')
    assert set(batch_tokens) == {12 * 128}, batch_tokens
    (_, lrs), = prometheus.samples('psyche_learning_rate{job="client"}')
    assert 0 < max(lrs) <= 2e-3, lrs  # the Cosine schedule's base_lr
    (_, norms), = prometheus.samples('psyche_optimizer_stats{job="client", stat="grad_norm"}')
    assert all(math.isfinite(n) and n > 0 for n in norms), norms
    (_, rss), = prometheus.samples('psyche_memory_usage_bytes{job="client"}')
    assert min(rss) > 100 << 20, rss  # torch and a model
    (_, cpu), = prometheus.samples('psyche_cpu_usage_percent{job="client"}')
    assert max(cpu) > 0, cpu
    phases = {v for _, vs in prometheus.samples('psyche_run_state{job="client"}') for v in vs}
    # Scrapes sample the phase: a short RoundTrain can fall between two of them on a busy
    # machine, so any round phase counts as "the run trained".
    assert 2.0 in phases and phases & {3.0, 4.0}, phases  # Warmup, RoundTrain/RoundWitness
    witnesses = prometheus.samples('psyche_witnesses_sent_total{job="client", type="witness"}')
    assert witnesses and witnesses[0][1][-1] >= 1
    roles = {m["role"] for m, vs in prometheus.samples(
        'psyche_participating_in_round{job="client"}') if max(vs) == 1}
    assert "witness" in roles
    (_, sent), = prometheus.samples('psyche_result_bytes_sent_total{job="client"}')
    assert sent[-1] > 0
    connections = {m["connection_type"] for m, _ in prometheus.samples(
        'psyche_peer_connections{job="client"}')}
    assert connections == {"direct", "relay"}


def test_prometheus_scraped_the_coordinator(local_run: LocalRun) -> None:
    prometheus = local_run.prometheus
    (labels, steps), = prometheus.samples('psyche_coordinator_step{job="coordinator"}')
    assert labels["service_instance_id"] == "server" and labels["run_id"] == RUN_ID
    assert steps == sorted(steps) and steps[-1] >= TOTAL_STEPS - 1
    healthy = prometheus.samples('psyche_coordinator_clients{job="coordinator", state="Healthy"}')
    assert max(healthy[0][1]) == 1
    (_, quorum), = prometheus.samples('psyche_coordinator_witness_quorum{job="coordinator"}')
    assert max(quorum) == 1  # witness_nodes = 1
    (_, durations), = prometheus.samples(
        'psyche_coordinator_round_duration_seconds{job="coordinator"}')
    assert all(0 < d < 30 for d in durations)
    phases = {v for _, vs in prometheus.samples('psyche_coordinator_run_state') for v in vs}
    # WaitingForMembers, Warmup and Finished last for seconds; a round's phases can each be
    # shorter than the 1 s scrape (one client on the tiny model: CI once saw every RoundTrain
    # fall between scrapes), so any round phase counts; the phase-duration histogram below
    # is what shows every phase, RoundTrain included.
    assert {1.0, 2.0, 6.0} <= phases and phases & {3.0, 4.0}, phases
    timed = {m["phase"] for m, _ in prometheus.samples(
        'psyche_coordinator_phase_duration_seconds{job="coordinator"}')}
    assert {"Warmup", "RoundTrain", "RoundWitness"} <= timed, timed


def _resources(requests: Sequence[object], service: str) -> list[dict[str, object]]:
    found = []
    for request in requests:
        groups = getattr(request, "resource_metrics", None) or getattr(
            request, "resource_spans", None) or getattr(request, "resource_logs", None)
        for group in groups:
            resource = attributes(group.resource.attributes)
            if resource.get("service.name") == service:
                found.append(resource)
    return found


def test_otlp_metrics_arrive_with_the_resource_attributes(local_run: LocalRun) -> None:
    requests = local_run.receiver.metrics()
    client = _resources(requests, "psyche-client")
    server = _resources(requests, "psyche-coordinator")
    assert client and server
    for resource in client:
        assert resource["service.instance.id"] == local_run.node_id
        assert resource["service.namespace"] == "psyche"
        assert resource["run.id"] == RUN_ID
        assert resource["deployment.environment.name"] == "telemetry-test"
        assert resource["service.version"]
    assert all(r["service.instance.id"] == "server" and r["run.id"] == RUN_ID for r in server)
    names = metric_names_by_service(requests)
    assert names["psyche-client"] <= {m.name for m in CLIENT_METRICS}
    assert {"psyche_round_step", "psyche_training_loss", "psyche_tokens_per_second",
            "psyche_last_train_time_seconds", "psyche_witnesses_sent_total",
            "psyche_gossip_neighbors"} <= names["psyche-client"]
    assert names["psyche-coordinator"] <= {m.name for m in COORDINATOR_METRICS}
    assert "psyche_coordinator_step" in names["psyche-coordinator"]
    headers = local_run.receiver.headers("/v1/metrics")
    client_headers = [h for h in headers if h.get("authorization")]
    assert client_headers and all(h["authorization"] == "Bearer test-token"
                                  for h in client_headers)


def test_otlp_spans_one_per_round_phase(local_run: LocalRun) -> None:
    requests = local_run.receiver.traces()
    assert all(r["service.instance.id"] == local_run.node_id
               for r in _resources(requests, "psyche-client"))
    spans = [span for request in requests for group in request.resource_spans
             for scope in group.scope_spans for span in scope.spans]
    by_name: dict[str, list[dict[str, Any]]] = {}  # attribute values as attributes() decodes them
    for span in spans:
        assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
        by_name.setdefault(span.name, []).append(attributes(span.attributes))
    assert {"warmup", "train", "apply", "witness", "cooldown"} <= set(by_name), set(by_name)
    trained_steps = sorted(int(a["psyche.step"]) for a in by_name["train"])
    assert trained_steps[0] == 1 and len(trained_steps) >= TOTAL_STEPS - 4


def test_otlp_logs_carry_events_and_server_lines(local_run: LocalRun) -> None:
    requests = local_run.receiver.logs()
    client = _resources(requests, "psyche-client")
    assert client and all(r["service.instance.id"] == local_run.node_id for r in client)
    records = [(attributes(group.resource.attributes)["service.name"], record)
               for request in requests for group in request.resource_logs
               for scope in group.scope_logs for record in scope.log_records]
    client_events = {attributes(r.attributes).get("psyche.event") for s, r in records
                     if s == "psyche-client"}
    assert {"trained", "witness", "finished"} <= client_events
    server_lines = [r.body.string_value for s, r in records if s == "psyche-coordinator"]
    assert any("joined" in line for line in server_lines), server_lines[:5]


def test_every_dashboard_query_runs_on_prometheus(local_run: LocalRun) -> None:
    """Valid PromQL for a real Prometheus, and the main panels show this run."""
    dashboards = sorted((REPO / "dashboards" / "grafana" / "dashboards").glob("*.json"))
    empty = []
    for path in dashboards:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                if target.get("datasource", {}).get("type") != "prometheus":
                    continue
                expr = target["expr"].replace("$run_id", RUN_ID).replace("$clients", ".*")
                # Instant queries at "now": over_time keeps the finished run visible.
                result = local_run.prometheus.query(f"last_over_time(({expr})[15m:1s])")
                if not result["result"]:
                    empty.append((path.name, panel["title"]))
    must_show = {("run-overview.json", "Loss"), ("run-overview.json", "Step"),
                 ("clients.json", "Round step"), ("clients.json", "Tokens per second"),
                 ("p2p-model-sharing.json", "Peer connections: direct vs relayed"),
                 ("clients.json", "Learning rate"), ("clients.json", "Memory (RSS)"),
                 ("clients.json", "Global batch (tokens)"),
                 ("run-overview.json", "Phase durations (the last of each phase)")}
    assert not must_show & set(empty), sorted(must_show & set(empty))
