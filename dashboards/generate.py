"""Writes the Grafana dashboards (Classic JSON model) under dashboards/grafana/dashboards/.

    .venv/bin/python dashboards/generate.py      # rewrite the JSON files
    .venv/bin/python dashboards/generate.py --check   # exit 1 if a file is out of date

The JSON files are what ops teams import; this script is how we keep four dashboards
consistent (same variables, same datasource, same label filters). Every query names
metrics from psyche_common/telemetry/names.py (tests/telemetry/test_dashboards.py checks
them against a real scrape). Labels: run_id, service_instance_id (node id or "server"),
service_name — copied from the OpenTelemetry resource by our Prometheus endpoint and by
the collector (resource_to_telemetry_conversion).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "grafana" / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
RUN = 'run_id=~"$run_id"'
CLIENTS = f'{RUN}, service_instance_id=~"$clients"'
RUN_STATES = ["Uninitialized", "WaitingForMembers", "Warmup", "RoundTrain", "RoundWitness",
              "Cooldown", "Finished", "Paused"]


class Layout:
    """Places panels left to right on Grafana's 24-column grid, rows as section headers."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = 0
        self.row_height = 0

    def _next_id(self) -> int:
        return len(self.panels) + 1

    def row(self, title: str) -> None:
        self.y += self.row_height
        self.x, self.row_height = 0, 0
        self.panels.append({"type": "row", "id": self._next_id(), "title": title,
                            "collapsed": False, "panels": [],
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}})
        self.y += 1

    def add(self, panel: dict[str, Any], w: int, h: int = 8) -> None:
        if self.x + w > 24:
            self.y += self.row_height
            self.x, self.row_height = 0, 0
        panel["id"] = self._next_id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)


def target(expr: str, legend: str = "", ref: str = "A") -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref,
            "range": True}


def timeseries(title: str, targets: list[dict[str, Any]], unit: str = "short",
               description: str = "") -> dict[str, Any]:
    return {"type": "timeseries", "title": title, "description": description,
            "datasource": DS, "targets": targets,
            "fieldConfig": {"defaults": {"unit": unit, "custom": {"lineWidth": 1,
                                                                   "fillOpacity": 10}},
                            "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title: str, expr: str, unit: str = "short", mappings: list[Any] | None = None,
         legend: str = "") -> dict[str, Any]:
    return {"type": "stat", "title": title, "datasource": DS,
            "targets": [target(expr, legend)],
            "fieldConfig": {"defaults": {"unit": unit, "mappings": mappings or []},
                            "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                          "values": False},
                        "colorMode": "value", "graphMode": "area", "textMode": "auto"}}


def run_state_mappings() -> list[dict[str, Any]]:
    return [{"type": "value", "options": {str(i): {"text": name, "index": i}
                                          for i, name in enumerate(RUN_STATES)}}]


def variables(client_variable: bool) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource",
         "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": ""},
        {"name": "run_id", "label": "Run", "type": "query", "datasource": DS,
         "query": {"query": "label_values(target_info, run_id)", "refId": "run"},
         "definition": "label_values(target_info, run_id)", "refresh": 2,
         "includeAll": True, "multi": False, "current": {}, "hide": 0, "sort": 1},
    ]
    if client_variable:
        query = f"label_values(psyche_round_step{{{RUN}}}, service_instance_id)"
        items.append({"name": "clients", "label": "Client", "type": "query", "datasource": DS,
                      "query": {"query": query, "refId": "clients"}, "definition": query,
                      "refresh": 2, "includeAll": True, "multi": True, "current": {},
                      "hide": 0, "sort": 1})
    return {"list": items}


def dashboard(uid: str, title: str, layout: Layout, client_variable: bool,
              description: str) -> dict[str, Any]:
    return {"uid": uid, "title": title, "description": description,
            "tags": ["psyche"], "schemaVersion": 41, "version": 1, "editable": True,
            "graphTooltip": 1, "refresh": "30s", "timezone": "browser",
            "time": {"from": "now-1h", "to": "now"}, "timepicker": {},
            "annotations": {"list": []}, "links": [], "fiscalYearStartMonth": 0,
            "templating": variables(client_variable), "panels": layout.panels}


def run_overview() -> dict[str, Any]:
    s = 'service_name="psyche-coordinator"'
    c = 'service_name="psyche-client"'
    lay = Layout()
    lay.row("Coordinator")
    lay.add(stat("Phase", f"psyche_coordinator_run_state{{{RUN}}}",
                 mappings=run_state_mappings()), 6, 4)
    lay.add(stat("Epoch", f"psyche_coordinator_epoch{{{RUN}}}"), 3, 4)
    lay.add(stat("Step", f"psyche_coordinator_step{{{RUN}}}"), 3, 4)
    lay.add(stat("Connected clients", f"psyche_coordinator_connected_clients{{{RUN}}}"), 4, 4)
    lay.add(stat("Witness quorum", f"psyche_coordinator_witness_quorum{{{RUN}}}"), 4, 4)
    lay.add(stat("Epochs finished", f"psyche_coordinator_epochs_finished_total{{{RUN}}}"), 4, 4)
    lay.add(timeseries("Clients by state", [target(
        f"psyche_coordinator_clients{{{RUN}}}", "{{state}}")]), 8)
    lay.add(timeseries("Witnesses and quorum", [
        target(f"psyche_coordinator_witnesses{{{RUN}}}", "witnesses", "A"),
        target(f"psyche_coordinator_witness_quorum{{{RUN}}}", "quorum", "B")]), 8)
    lay.add(timeseries("Round duration", [target(
        f"psyche_coordinator_round_duration_seconds{{{RUN}}}", "coordinator")], "s"), 8)
    lay.add(timeseries("Phase durations (the last of each phase)", [target(
        f"psyche_coordinator_phase_duration_seconds{{{RUN}}}", "{{phase}}")], "s"), 24)
    lay.row("Training")
    lay.add(timeseries("Loss", [target(f"psyche_training_loss{{{RUN}, {c}}}",
                                       "{{service_instance_id}}")]), 12)
    lay.add(timeseries("Tokens per second (all clients)", [target(
        f"sum by (run_id) (psyche_tokens_per_second{{{RUN}}})", "{{run_id}}")]), 12)
    lay.add(timeseries("Tokens trained", [target(
        f"sum by (run_id) (psyche_total_tokens_total{{{RUN}}})", "{{run_id}}")]), 8)
    lay.add(timeseries("Step time per client", [target(
        f"psyche_last_train_time_seconds{{{RUN}}}", "{{service_instance_id}}")], "s"), 8)
    lay.add(timeseries("Step per client", [target(
        f"psyche_round_step{{{RUN}}}", "{{service_instance_id}}")]), 8)
    lay.add(timeseries("Learning rate", [target(
        f"max by (run_id) (psyche_learning_rate{{{RUN}}})", "{{run_id}}")], "sci"), 12)
    lay.add(timeseries("Global batch (tokens)", [target(
        f"max by (run_id) (psyche_token_batch_size{{{RUN}}})", "{{run_id}}")]), 12)
    lay.add(timeseries("State changes per minute", [target(
        f"rate(psyche_coordinator_state_changes_total{{{RUN}, {s}}}[5m]) * 60", "broadcasts")]),
        12)
    lay.add(timeseries("Witnesses sent per minute", [target(
        f"sum by (type) (rate(psyche_witnesses_sent_total{{{RUN}}}[5m])) * 60", "{{type}}")]),
        12)
    return dashboard("psyche-run-overview", "Psyche / Run overview", lay, False,
                     "The coordinator's view of a run and its training progress.")


def clients() -> dict[str, Any]:
    lay = Layout()
    lay.row("State")
    lay.add(timeseries("Round step", [target(f"psyche_round_step{{{CLIENTS}}}",
                                             "{{service_instance_id}}")]), 8)
    lay.add(timeseries("Phase seen by the client", [target(
        f"psyche_run_state{{{CLIENTS}}}", "{{service_instance_id}}")]), 8)
    lay.add(timeseries("Role this round", [target(
        f"psyche_participating_in_round{{{CLIENTS}}} == 1",
        "{{service_instance_id}} {{role}}")]), 8)
    lay.add(timeseries("Loss", [target(f"psyche_training_loss{{{CLIENTS}}}",
                                       "{{service_instance_id}}")]), 8)
    lay.add(timeseries("Perplexity", [target(f"psyche_training_perplexity{{{CLIENTS}}}",
                                             "{{service_instance_id}}")]), 8)
    lay.add(timeseries("Tokens per second", [target(f"psyche_tokens_per_second{{{CLIENTS}}}",
                                                    "{{service_instance_id}}")]), 8)
    lay.add(timeseries("Train step time", [target(
        f"psyche_last_train_time_seconds{{{CLIENTS}}}", "{{service_instance_id}}")], "s"), 8)
    lay.add(timeseries("Round duration", [target(
        f"psyche_round_duration_seconds{{{CLIENTS}}}", "{{service_instance_id}}")], "s"), 8)
    lay.add(timeseries("Confidence", [target(
        f"psyche_training_confidence{{{CLIENTS}}}", "{{service_instance_id}}")],
        description="1 - loss / log2(vocabulary size): 1 certain, 0 a uniform guess "
                    "(Psyche's StatsLogger)"), 8)
    lay.add(timeseries("Efficiency", [target(
        f"psyche_training_efficiency{{{CLIENTS}}}", "{{service_instance_id}}")],
        "percentunit", description="training time over wall time between step ends, "
                                   "last 16 steps"), 8)
    lay.add(timeseries("Results applied / failed / ignored (per minute)", [
        target(f"rate(psyche_apply_message_success_total{{{CLIENTS}}}[5m]) * 60",
               "{{service_instance_id}} applied", "A"),
        target(f"rate(psyche_apply_message_failure_total{{{CLIENTS}}}[5m]) * 60",
               "{{service_instance_id}} failed", "B"),
        target(f"rate(psyche_apply_message_ignored_total{{{CLIENTS}}}[5m]) * 60",
               "{{service_instance_id}} ignored", "C")]), 8)
    lay.add(timeseries("This round: finishes / announcements / downloads", [
        target(f"psyche_finishes_received_this_round{{{CLIENTS}}}",
               "{{service_instance_id}} finished", "A"),
        target(f"psyche_result_announcements_received_current_round{{{CLIENTS}}}",
               "{{service_instance_id}} announced", "B"),
        target(f"psyche_results_downloaded_current_round{{{CLIENTS}}}",
               "{{service_instance_id}} downloaded", "C")]), 12)
    lay.add(timeseries("Previous round: finishes / announcements / downloads", [
        target(f"psyche_finishes_received_previous_round{{{CLIENTS}}}",
               "{{service_instance_id}} finished", "A"),
        target(f"psyche_result_announcements_received_previous_round{{{CLIENTS}}}",
               "{{service_instance_id}} announced", "B"),
        target(f"psyche_results_downloaded_previous_round{{{CLIENTS}}}",
               "{{service_instance_id}} downloaded", "C")]), 12)
    lay.add(timeseries("Witnesses sent", [target(
        f"psyche_witnesses_sent_total{{{CLIENTS}}}", "{{service_instance_id}} {{type}}")]), 12)
    lay.add(timeseries("Taken out of an epoch, by reason", [target(
        f"psyche_client_removed_total{{{CLIENTS}}}", "{{service_instance_id}} {{reason}}")],
        description="late-witness, training-over-time, health-check, paused or withdrawn, "
                    "as the client infers it (client_image/runtime/removal.py)"), 12)
    lay.row("Optimizer")
    lay.add(timeseries("Learning rate", [target(f"psyche_learning_rate{{{CLIENTS}}}",
                                                "{{service_instance_id}}")], "sci"), 8)
    lay.add(timeseries("Global batch (tokens)", [target(
        f"psyche_token_batch_size{{{CLIENTS}}}", "{{service_instance_id}}")]), 8)
    lay.add(timeseries("Optimizer statistics", [target(
        f"psyche_optimizer_stats{{{CLIENTS}}}", "{{service_instance_id}} {{stat}}")]), 8)
    lay.row("Machine (sampled every 5 s; GPU panels only where CUDA is available)")
    lay.add(timeseries("CPU usage (100 = one core)", [target(
        f"psyche_cpu_usage_percent{{{CLIENTS}}}", "{{service_instance_id}}")], "percent"), 12)
    lay.add(timeseries("Memory (RSS)", [target(
        f"psyche_memory_usage_bytes{{{CLIENTS}}}", "{{service_instance_id}}")], "bytes"), 12)
    lay.add(timeseries("GPU usage", [target(
        f"psyche_gpu_usage_percent{{{CLIENTS}}}", "{{service_instance_id}} gpu {{gpu}}")],
        "percent"), 8)
    lay.add(timeseries("GPU memory in use", [target(
        f"psyche_gpu_memory{{{CLIENTS}}}", "{{service_instance_id}} gpu {{gpu}}")],
        "bytes"), 8)
    lay.add(timeseries("GPU temperature", [target(
        f"psyche_gpu_temp{{{CLIENTS}}}", "{{service_instance_id}} gpu {{gpu}}")],
        "celsius"), 8)
    lay.row("P2P model sharing")
    lay.add(timeseries("Model parameters downloaded from peers", [target(
        f"psyche_p2p_model_params_downloaded{{{CLIENTS}}}", "{{service_instance_id}}")],
        "percent"), 12)
    lay.add(timeseries("Gossip neighbours", [target(
        f"psyche_gossip_neighbors{{{CLIENTS}}}", "{{service_instance_id}}")]), 12)
    lay.row("Logs")
    lay.add({"type": "logs", "title": "Client logs",
             "datasource": {"type": "loki", "uid": "loki"},
             "targets": [{"datasource": {"type": "loki", "uid": "loki"}, "refId": "A",
                          "expr": '{service_name="psyche-client"} '
                                  '| service_instance_id=~"$clients"'}],
             "options": {"showTime": True, "wrapLogMessage": True, "sortOrder": "Descending"}},
            24, 10)
    return dashboard("psyche-clients", "Psyche / Clients", lay, True,
                     "One row of panels per concern, filtered by client (node id).")


def p2p() -> dict[str, Any]:
    lay = Layout()
    lay.row("Peers")
    lay.add(timeseries("Peer connections: direct vs relayed", [target(
        f"sum by (connection_type) (psyche_peer_connections{{{CLIENTS}}})",
        "{{connection_type}}")]), 8)
    lay.add(timeseries("Gossip neighbours", [target(
        f"psyche_gossip_neighbors{{{CLIENTS}}}", "{{service_instance_id}}")]), 8)
    lay.add(timeseries("Connection latency", [target(
        f"psyche_connection_latency_seconds{{{CLIENTS}}}",
        "{{service_instance_id}} → {{peer}}")], "s"), 8)
    lay.add(timeseries("UDP bandwidth", [
        target(f"sum by (service_instance_id) (rate(psyche_p2p_bytes_sent{{{CLIENTS}}}[1m]))",
               "{{service_instance_id}} out", "A"),
        target(f"sum by (service_instance_id) (rate(psyche_p2p_bytes_received{{{CLIENTS}}}[1m]))",
               "{{service_instance_id}} in", "B")], "Bps"), 12)
    lay.add(timeseries("Result bytes sent / received", [
        target(f"rate(psyche_result_bytes_sent_total{{{CLIENTS}}}[5m])",
               "{{service_instance_id}} sent", "A"),
        target(f"rate(psyche_result_bytes_received_total{{{CLIENTS}}}[5m])",
               "{{service_instance_id}} received", "B")], "Bps"), 12)
    lay.row("Blob downloads")
    lay.add(timeseries("Downloads per minute", [
        target(f"sum(rate(psyche_downloads_started_total{{{CLIENTS}}}[5m])) * 60",
               "started", "A"),
        target(f"sum(rate(psyche_downloads_finished_total{{{CLIENTS}}}[5m])) * 60",
               "finished", "B"),
        target(f"sum(rate(psyche_downloads_retry_total{{{CLIENTS}}}[5m])) * 60",
               "retried", "C"),
        target(f"sum(rate(psyche_downloads_failed_total{{{CLIENTS}}}[5m])) * 60",
               "failed", "D")]), 12)
    lay.add(timeseries("Download throughput", [target(
        f"rate(psyche_download_bytes_total{{{CLIENTS}}}[1m])", "{{service_instance_id}}")],
        "Bps"), 12)
    lay.add(timeseries("Bandwidth as the client measures it (5 s windows)", [target(
        f"psyche_bandwidth_bytes_per_second{{{CLIENTS}}}", "{{service_instance_id}}")],
        "Bps"), 12)
    lay.add(timeseries("Results lost: downloads failed for good", [target(
        f"increase(psyche_downloads_perma_failed_total{{{CLIENTS}}}[1h])",
        "{{service_instance_id}}")]), 12)
    lay.row("P2P model sharing")
    lay.add(timeseries("Model parameters downloaded", [target(
        f"psyche_p2p_model_params_downloaded{{{CLIENTS}}}", "{{service_instance_id}}")],
        "percent"), 12)
    lay.add(timeseries("Model downloads from peers that failed", [target(
        f"increase(psyche_p2p_params_download_failed_counter_total{{{CLIENTS}}}[1h])",
        "{{service_instance_id}}")]), 12)
    return dashboard("psyche-p2p", "Psyche / P2P and model sharing", lay, True,
                     "iroh connections, gossip, result and parameter downloads.")


def run_manager() -> dict[str, Any]:
    m = f'{RUN}, service_name="psyche-run-manager"'
    lay = Layout()
    lay.row("Containers")
    lay.add(stat("Client container running",
                 f"sum(psyche_run_manager_container_running{{{m}}})"), 6, 4)
    lay.add(stat("Starts", f"sum(psyche_run_manager_container_starts_total{{{m}}})"), 6, 4)
    lay.add(stat("Restarts", f"sum(psyche_run_manager_container_restarts_total{{{m}}})"), 6, 4)
    lay.add(stat("Last uptime", f"max(psyche_run_manager_container_uptime_seconds{{{m}}})",
                 "s"), 6, 4)
    lay.add(timeseries("Restarts by reason", [target(
        f"sum by (reason) (increase(psyche_run_manager_container_restarts_total{{{m}}}[15m]))",
        "{{reason}}")]), 12)
    lay.add(timeseries("Exits by exit code", [target(
        f"sum by (exit_code) (increase(psyche_run_manager_container_exits_total{{{m}}}[15m]))",
        "exit {{exit_code}}")]), 12)
    lay.add(timeseries("Running containers per machine", [target(
        f"psyche_run_manager_container_running{{{m}}}", "{{service_instance_id}}")]), 24)
    return dashboard("psyche-run-manager", "Psyche / Run manager", lay, False,
                     "Client containers supervised by run-manager: starts, exits, restarts.")


DASHBOARDS = {
    "run-overview.json": run_overview, "clients.json": clients,
    "p2p-model-sharing.json": p2p, "run-manager.json": run_manager,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        text, path = render(build), OUT / name
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("out of date (run dashboards/generate.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
