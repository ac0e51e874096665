"""Every metric our programs export, in one registry the instruments are created from.

Names are Psyche's (`shared/metrics/src/lib.rs`; docs/metrics.md, "Metric names") where
Psyche has the metric, so dashboards written for Psyche keep working; new metrics use
the same `psyche_` prefix (`CLIENT_METRICS`, `COORDINATOR_METRICS`, `RUN_MANAGER_METRICS`;
`GPU_ONLY_METRICS`: the series only a machine with a CUDA GPU exports). The dashboards
test reads this registry (and a real scrape) to check that every dashboard query names
a series that really exists.

Prometheus spelling: the OpenTelemetry Prometheus exporter (and Prometheus' own OTLP
translation) appends `_total` to counters that do not already end with it, so the
counter `psyche_downloads_started` is scraped as `psyche_downloads_started_total`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "observable_gauge", "observable_counter", "histogram"]
Service = Literal["client", "coordinator", "run-manager"]

SERVICE_NAMES: dict[Service, str] = {
    "client": "psyche-client",
    "coordinator": "psyche-coordinator",
    "run-manager": "psyche-run-manager",
}
METER_NAMES: dict[Service, str] = {
    "client": "psyche_client",
    "coordinator": "psyche_coordinator",
    "run-manager": "psyche_run_manager",
}


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    service: Service
    description: str
    unit: str = ""
    labels: tuple[str, ...] = ()

    @property
    def otel_unit(self) -> str:
        """The unit given to the SDK: only where the name already ends with it, because
        the Prometheus exporter appends a missing unit suffix and would rename Psyche's
        metrics (`psyche_p2p_model_params_downloaded` must not become `..._percent`)."""
        suffixes = {"s": "_seconds", "By": "_bytes"}
        suffix = suffixes.get(self.unit)
        return self.unit if suffix is not None and self.name.endswith(suffix) else ""

    @property
    def prometheus_name(self) -> str:
        counting = self.kind in ("counter", "observable_counter")
        if counting and not self.name.endswith("_total"):
            return self.name + "_total"
        return self.name

    @property
    def prometheus_series(self) -> tuple[str, ...]:
        """Names a PromQL query may use for this metric (histograms have three)."""
        if self.kind == "histogram":
            return tuple(f"{self.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        return (self.prometheus_name,)


def _client(name: str, kind: Kind, description: str, unit: str = "",
            labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, kind, "client", description, unit, labels)


def _server(name: str, kind: Kind, description: str, unit: str = "",
            labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, kind, "coordinator", description, unit, labels)


def _manager(name: str, kind: Kind, description: str, unit: str = "",
             labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, kind, "run-manager", description, unit, labels)


CLIENT_METRICS: tuple[MetricSpec, ...] = (
    # --- where the run is, as this client sees it
    _client("psyche_run_state", "observable_gauge",
            "coordinator phase (RunState: 1 WaitingForMembers, 2 Warmup, 3 RoundTrain, "
            "4 RoundWitness, 5 Cooldown, 6 Finished, 7 Paused)"),
    _client("psyche_epoch", "observable_gauge", "current epoch"),
    _client("psyche_round_step", "observable_gauge", "step of the round this client is in"),
    _client("psyche_participating_in_round", "observable_gauge",
            "1 for this client's role in the current round", labels=("role",)),
    # --- training
    _client("psyche_training_loss", "observable_gauge", "loss of the last trained batch"),
    _client("psyche_training_perplexity", "observable_gauge", "exp(loss) of the last batch"),
    _client("psyche_tokens_per_second", "observable_gauge", "tokens/s of the last train step"),
    _client("psyche_training_confidence", "observable_gauge",
            "1 - loss / log2(vocabulary size) of the last batch: 1 certain, 0 a uniform guess "
            "(Psyche's StatsLogger)"),
    _client("psyche_training_efficiency", "observable_gauge",
            "training time over wall time between step ends, last 16 steps (Psyche's "
            "StatsLogger)"),
    _client("psyche_total_tokens", "counter", "tokens this client has trained on", "{token}"),
    _client("psyche_last_train_time_seconds", "gauge", "seconds the last train step took", "s"),
    _client("psyche_learning_rate", "gauge", "learning rate of the step just trained"),
    _client("psyche_token_batch_size", "gauge",
            "tokens in the global batch of the step just trained (sequences x max_seq_len)",
            "{token}"),
    _client("psyche_optimizer_stats", "gauge",
            "the optimizer's statistics of the step just trained (stat=grad_norm: the "
            "gradient's total L2 norm before clipping)", labels=("stat",)),
    _client("psyche_eval_metrics", "gauge",
            "the last score of each eval task, scored between epochs (docs/evals.md)",
            labels=("task", "metric")),
    _client("psyche_round_duration_seconds", "gauge",
            "seconds between the starts of the last two training rounds", "s"),
    _client("psyche_trained_steps", "counter", "train steps this client completed"),
    # --- results
    _client("psyche_result_bytes_sent", "counter",
            "bytes of this client's own results published to its peers", "By"),
    _client("psyche_result_bytes_received", "observable_counter",
            "bytes of peers' results downloaded and verified", "By"),
    _client("psyche_broadcasts_seen_total", "observable_counter", "gossip broadcasts received"),
    _client("psyche_apply_message_success", "observable_counter", "results applied"),
    _client("psyche_apply_message_failure", "observable_counter",
            "results that failed (download, commitment or decode)"),
    _client("psyche_apply_message_ignored", "observable_counter",
            "broadcasts ignored (unexpected step, batch or sender)"),
    _client("psyche_finishes_received_this_round", "observable_gauge",
            "Finished broadcasts received for the current step"),
    _client("psyche_result_announcements_received_current_round", "observable_gauge",
            "result announcements received for the current step"),
    _client("psyche_results_downloaded_current_round", "observable_gauge",
            "results downloaded and verified for the current step"),
    _client("psyche_finishes_received_previous_round", "observable_gauge",
            "Finished broadcasts received for the previous step"),
    _client("psyche_result_announcements_received_previous_round", "observable_gauge",
            "result announcements received for the previous step"),
    _client("psyche_results_downloaded_previous_round", "observable_gauge",
            "results downloaded and verified for the previous step"),
    _client("psyche_witnesses_sent_total", "counter", "witness messages sent",
            labels=("type",)),
    # --- verification (docs/verification.md): replays of the trainers this client follows
    _client("psyche_verification_following", "gauge",
            "trainers this client follows (replays) in the current epoch"),
    _client("psyche_verifications_passed", "observable_counter",
            "followed trainers' results this client's replay reproduced"),
    _client("psyche_verifications_failed", "observable_counter",
            "followed trainers' results this client's replay did not reproduce"),
    _client("psyche_verification_reports_sent", "observable_counter",
            "verification reports this client sent to the coordinator"),
    _client("psyche_ejected", "gauge",
            "1 once the coordinator ejected this client (its followers reported it)"),
    _client("psyche_client_removed", "counter",
            "times the coordinator took this client out of an epoch, by the reason the "
            "client infers (late-witness, training-over-time, health-check, paused, withdrawn)",
            labels=("reason",)),
    # --- blob downloads (results and model parameters)
    _client("psyche_downloads_started", "observable_counter", "blob downloads started"),
    _client("psyche_downloads_finished", "observable_counter", "blob downloads finished"),
    _client("psyche_downloads_retry", "observable_counter", "blob download retries"),
    _client("psyche_downloads_failed_total", "observable_counter", "blob downloads failed"),
    _client("psyche_download_bytes", "observable_counter", "blob bytes downloaded", "By"),
    _client("psyche_downloads_perma_failed_total", "counter",
            "peers' results that could not be downloaded from any provider, all retries spent"),
    _client("psyche_bandwidth_bytes_per_second", "observable_gauge",
            "blob bytes downloaded per second over the last sampling window (5 s or more)",
            "By/s"),
    # --- model sharing
    _client("psyche_p2p_model_params_downloaded", "gauge",
            "percent of the model's parameters downloaded from peers", "%"),
    _client("psyche_p2p_params_download_failed_counter", "counter",
            "model downloads from peers that failed"),
    # --- peers
    _client("psyche_gossip_neighbors", "observable_gauge", "gossip neighbours of the run topic"),
    _client("psyche_peer_connections", "observable_gauge", "connected peers by path",
            labels=("connection_type",)),
    _client("psyche_p2p_bytes_sent", "observable_gauge",
            "UDP bytes sent on the current peer connections", "By"),
    _client("psyche_p2p_bytes_received", "observable_gauge",
            "UDP bytes received on the current peer connections", "By"),
    _client("psyche_connection_latency_seconds", "observable_gauge",
            "round-trip time of the best connection to each peer", "s", labels=("peer",)),
    # --- the machine, sampled every 5 s at most (client_image/telemetry/system.py)
    _client("psyche_cpu_usage_percent", "observable_gauge",
            "CPU use of the client process (100 = one core busy)", "%"),
    _client("psyche_memory_usage_bytes", "observable_gauge",
            "resident memory (RSS) of the client process", "By"),
    _client("psyche_gpu_usage_percent", "observable_gauge",
            "GPU utilisation (NVML); only where CUDA is available", "%", labels=("gpu",)),
    _client("psyche_gpu_memory", "observable_gauge",
            "GPU memory in use, bytes (NVML); only where CUDA is available", "By",
            labels=("gpu",)),
    _client("psyche_gpu_temp", "observable_gauge",
            "GPU temperature, degrees Celsius (NVML); only where CUDA is available", "Cel",
            labels=("gpu",)),
)

# Series that exist only on a machine with a CUDA GPU: no CPU-only run exports them, so a
# dashboard panel of them may be empty there (tests/telemetry checks the others have data).
GPU_ONLY_METRICS: frozenset[str] = frozenset(
    {"psyche_gpu_usage_percent", "psyche_gpu_memory", "psyche_gpu_temp"})

COORDINATOR_METRICS: tuple[MetricSpec, ...] = (
    _server("psyche_coordinator_run_state", "gauge", "phase (RunState integer)"),
    _server("psyche_coordinator_epoch", "gauge", "current epoch"),
    _server("psyche_coordinator_step", "gauge", "current step"),
    _server("psyche_coordinator_clients", "gauge", "clients of the epoch by state",
            labels=("state",)),
    _server("psyche_coordinator_connected_clients", "gauge", "clients connected to the server"),
    _server("psyche_coordinator_witnesses", "gauge", "witnesses received in the current round"),
    _server("psyche_coordinator_witness_quorum", "gauge",
            "agreeing witnesses needed for the round to count"),
    _server("psyche_coordinator_verification_reports", "gauge",
            "verification reports recorded in the current epoch"),
    _server("psyche_coordinator_ejected_clients", "gauge",
            "clients of the current epoch ejected by their followers' reports"),
    _server("psyche_coordinator_model_resets", "gauge",
            "epochs that started from the run's stored checkpoint because no client holding "
            "the newer model came back (its training since was lost)"),
    _server("psyche_coordinator_model_lost", "gauge",
            "1 while the run waits for a client holding its newer model (none came back, no "
            "upload as new was reported) or for its authority to accept the loss, else 0"),
    _server("psyche_coordinator_round_duration_seconds", "gauge",
            "seconds between the starts of the last two training rounds", "s"),
    _server("psyche_coordinator_phase_duration_seconds", "gauge",
            "seconds the last completed phase of each RunState lasted (a round's RoundTrain "
            "ends at its RoundWitness or at the next step)", "s", labels=("phase",)),
    _server("psyche_coordinator_state_changes", "counter", "state broadcasts sent"),
    _server("psyche_coordinator_epochs_finished", "counter", "epochs that reached Cooldown"),
)

RUN_MANAGER_METRICS: tuple[MetricSpec, ...] = (
    _manager("psyche_run_manager_container_starts", "counter", "client containers started"),
    _manager("psyche_run_manager_container_restarts", "counter",
             "client container restarts by reason", labels=("reason",)),
    _manager("psyche_run_manager_container_exits", "counter",
             "client container exits by exit code", labels=("exit_code",)),
    _manager("psyche_run_manager_container_running", "gauge", "1 while a client container runs"),
    _manager("psyche_run_manager_container_uptime_seconds", "gauge",
             "how long the last container ran before it exited", "s"),
)

ALL_METRICS: tuple[MetricSpec, ...] = CLIENT_METRICS + COORDINATOR_METRICS + RUN_MANAGER_METRICS
METRICS_BY_SERVICE: dict[Service, tuple[MetricSpec, ...]] = {
    "client": CLIENT_METRICS,
    "coordinator": COORDINATOR_METRICS,
    "run-manager": RUN_MANAGER_METRICS,
}

# Labels every series carries (resource attributes copied onto each point, see
# prometheus.py; the collector config does the same with resource_to_telemetry_conversion).
RESOURCE_LABELS: tuple[str, ...] = ("service_name", "service_instance_id", "run_id")


def prometheus_names() -> set[str]:
    """Every series name a PromQL query may use, for dashboards and their test."""
    return {series for spec in ALL_METRICS for series in spec.prometheus_series}
