"""The client's telemetry: what `psyche-client train` exports, read from the runtime.

Three sources, so the runtime needs almost no telemetry code of its own:
  * observed on each collection (export or scrape): the runtime's `Counters`, the p2p
    node's blob download stats, gossip neighbours and connection diagnostics;
  * the runtime's typed events (`EventLog.listeners`, client_image.runtime.events):
    Trained, WitnessSent, StateChanged, Following, Ejected, EvalScored…;
  * the machine (system.py), sampled every 5 s at most: this process's CPU and memory,
    the blob download bandwidth and, only where CUDA is available, each GPU's usage,
    memory and temperature (no GPU series at all on a CPU machine);
  * spans: the round runner's `tracer.phase(name, state)` around warm-up, apply, train,
    witness and cooldown, attributes step and epoch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from client_image.p2p.diagnostics import PeerDiagnostics
from client_image.runtime.events import (
    DownloadFailed,
    Ejected,
    EvalScored,
    Following,
    ModelLoaded,
    Removed,
    RuntimeEvent,
    StateChanged,
    TaskFailed,
    Trained,
    WarmupWitnessSent,
    WitnessSent,
)
from client_image.telemetry.system import GpuReading, SystemSampler, nvml_gpus
from client_image.telemetry.training_stats import TrainingStats, model_vocab_size
from coordinator import CoordinatorState
from psyche_common.telemetry.core import Telemetry

if TYPE_CHECKING:
    from client_image.runtime.client import PsycheClient

RUN_STATES = {"Uninitialized": 0, "WaitingForMembers": 1, "Warmup": 2, "RoundTrain": 3,
              "RoundWitness": 4, "Cooldown": 5, "Finished": 6, "Paused": 7}
ROLES = {"NotInRound": "not_in_round", "Trainer": "trainer", "Witness": "witness"}
Point = tuple[float, dict[str, str]]


class ClientTelemetry:
    def __init__(self, telemetry: Telemetry, client: PsycheClient,
                 sampler: SystemSampler | None = None):
        self.telemetry = telemetry
        self.client = client
        self._last_round_start: float | None = None
        self._diagnostics_cache: list[PeerDiagnostics] = []
        self._diagnostics_at = -1.0
        counters = client.counters

        def one(read: Callable[[], float | None]) -> Callable[[], Iterable[Point]]:
            return lambda: [] if (value := read()) is None else [(float(value), {})]

        observe = telemetry.observe
        observe("psyche_run_state", one(lambda: RUN_STATES.get(counters.phase)))
        observe("psyche_epoch", one(lambda: counters.epoch if counters.phase else None))
        observe("psyche_round_step", one(lambda: counters.round_step))
        observe("psyche_participating_in_round", lambda: [
            (1.0 if counters.role == role else 0.0, {"role": label})
            for role, label in ROLES.items()])
        observe("psyche_training_loss", one(lambda: counters.loss))
        observe("psyche_training_perplexity", one(
            lambda: math.exp(min(counters.loss, 80.0)) if counters.loss is not None else None))
        observe("psyche_tokens_per_second", one(lambda: counters.tokens_per_sec))
        # The worker holds no model before the first warm-up (and a stand-in client none).
        self.stats = TrainingStats(lambda: model_vocab_size(
            getattr(getattr(client, "worker", None), "model", None)))
        observe("psyche_training_confidence", one(lambda: self.stats.confidence))
        observe("psyche_training_efficiency", one(lambda: self.stats.efficiency))
        observe("psyche_broadcasts_seen_total", one(lambda: counters.broadcasts_seen))
        observe("psyche_apply_message_success", one(lambda: counters.apply_message_success))
        observe("psyche_apply_message_failure", one(lambda: counters.apply_message_failure))
        observe("psyche_apply_message_ignored", one(lambda: counters.apply_message_ignored))
        observe("psyche_finishes_received_this_round", one(lambda: counters.finishes_current))
        observe("psyche_result_announcements_received_current_round",
                one(lambda: counters.announcements_current))
        observe("psyche_results_downloaded_current_round",
                one(lambda: counters.downloaded_current))
        observe("psyche_finishes_received_previous_round", one(lambda: counters.finishes_previous))
        observe("psyche_result_announcements_received_previous_round",
                one(lambda: counters.announcements_previous))
        observe("psyche_results_downloaded_previous_round",
                one(lambda: counters.downloaded_previous))
        observe("psyche_result_bytes_received", one(lambda: counters.result_bytes_received))
        observe("psyche_verifications_passed", one(lambda: counters.verifications_passed))
        observe("psyche_verifications_failed", one(lambda: counters.verifications_failed))
        observe("psyche_verification_reports_sent",
                one(lambda: counters.verification_reports_sent))
        stats = lambda: client.node.blobs.stats  # noqa: E731
        observe("psyche_downloads_started", one(lambda: stats().started))
        observe("psyche_downloads_finished", one(lambda: stats().finished))
        observe("psyche_downloads_retry", one(lambda: stats().retries))
        observe("psyche_downloads_failed_total", one(lambda: stats().failed))
        observe("psyche_download_bytes", one(lambda: stats().bytes_received))
        observe("psyche_gossip_neighbors", one(self._neighbours))
        observe("psyche_peer_connections", self._peer_connections)
        observe("psyche_p2p_bytes_sent", one(lambda: sum(
            d.bytes_sent for d in self._diagnostics())))
        observe("psyche_p2p_bytes_received", one(lambda: sum(
            d.bytes_received for d in self._diagnostics())))
        observe("psyche_connection_latency_seconds", lambda: [
            (d.rtt_ms / 1000.0, {"peer": d.peer_hex[:16]})
            for d in self._diagnostics() if d.rtt_ms is not None])
        self.sampler = sampler or SystemSampler(lambda: stats().bytes_received,
                                                gpus=nvml_gpus())
        self._observe_system()
        telemetry.gauge("psyche_ejected").set(0)  # a series from the start, for alerts
        client.events.listeners.append(self.on_event)

    def _observe_system(self) -> None:
        observe, latest = self.telemetry.observe, self.sampler.latest
        observe("psyche_cpu_usage_percent", lambda: [(latest().cpu_percent, {})])
        observe("psyche_memory_usage_bytes", lambda: [(float(latest().rss_bytes), {})])
        observe("psyche_bandwidth_bytes_per_second", lambda: [] if (
            rate := latest().bytes_per_second) is None else [(rate, {})])
        if self.sampler.gpus is None:  # no CUDA: the GPU series do not exist here
            return
        readers: dict[str, Callable[[GpuReading], float]] = {
            "psyche_gpu_usage_percent": lambda gpu: gpu.usage_percent,
            "psyche_gpu_memory": lambda gpu: float(gpu.memory_bytes),
            "psyche_gpu_temp": lambda gpu: gpu.temperature_c}
        def per_gpu(read: Callable[[GpuReading], float]) -> Callable[[], list[Point]]:
            return lambda: [(read(gpu), {"gpu": str(gpu.index)}) for gpu in latest().gpus]

        for name, read in readers.items():
            observe(name, per_gpu(read))

    def _neighbours(self) -> float | None:
        topic = self.client.topic
        for _ in range(3):  # the set may change under us (see _diagnostics)
            try:
                return None if topic is None else float(len(topic.neighbours()))
            except RuntimeError:
                continue
        return None

    def _diagnostics(self) -> list[PeerDiagnostics]:
        """One snapshot of the connections per collection (four metrics read it).

        Collection runs on an exporter or scrape thread while the event loop opens and
        closes connections; a snapshot taken mid-change raises RuntimeError, so retry.
        """
        now = time.monotonic()
        if now - self._diagnostics_at < 0.5:
            return self._diagnostics_cache
        for _ in range(3):
            try:
                self._diagnostics_cache = self.client.node.diagnostics()
                break
            except RuntimeError:
                continue
        self._diagnostics_at = now
        return self._diagnostics_cache

    def _peer_connections(self) -> list[Point]:
        counts = {"direct": 0, "relay": 0}
        for diag in self._diagnostics():
            if diag.connection_type in counts:
                counts[diag.connection_type] += 1
        return [(float(n), {"connection_type": kind}) for kind, n in counts.items()]

    # ------------------------------------------------------------------ events
    def on_event(self, event: RuntimeEvent) -> None:
        t = self.telemetry
        t.log_event(event.NAME, event.fields())
        match event:
            case Trained(seconds=seconds, payload_bytes=payload_bytes, tokens=tokens):
                self.stats.on_trained(event)
                t.gauge("psyche_last_train_time_seconds").set(seconds)
                t.gauge("psyche_learning_rate").set(event.learning_rate)
                if event.batch_tokens > 0:
                    t.gauge("psyche_token_batch_size").set(event.batch_tokens)
                if math.isfinite(event.grad_norm):
                    t.gauge("psyche_optimizer_stats").set(event.grad_norm, {"stat": "grad_norm"})
                t.counter("psyche_trained_steps").add(1)
                t.counter("psyche_result_bytes_sent").add(payload_bytes)
                t.counter("psyche_total_tokens").add(max(0, tokens))
            case WitnessSent():
                t.counter("psyche_witnesses_sent_total").add(1, {"type": "witness"})
            case WarmupWitnessSent():
                t.counter("psyche_witnesses_sent_total").add(1, {"type": "warmup"})
            case StateChanged(phase="RoundTrain"):
                now = time.monotonic()
                if self._last_round_start is not None:
                    t.gauge("psyche_round_duration_seconds").set(now - self._last_round_start)
                self._last_round_start = now
            case ModelLoaded(source="p2p"):
                t.gauge("psyche_p2p_model_params_downloaded").set(100.0)
            case DownloadFailed():  # every provider and retry spent: the result is lost
                t.counter("psyche_downloads_perma_failed_total").add(1)
            case TaskFailed(error_type="ModelFetchFailed"):  # runtime/peers.py
                t.counter("psyche_p2p_params_download_failed_counter").add(1)
            case Following(trainers=trainers, able=able):
                t.gauge("psyche_verification_following").set(len(trainers) if able else 0)
            case Ejected():
                t.gauge("psyche_verification_following").set(0)
                t.gauge("psyche_ejected").set(1)
            case Removed(reason=reason):
                t.counter("psyche_client_removed").add(1, {"reason": reason})
            case EvalScored(task=task):
                for metric, value in event.metrics().items():
                    t.gauge("psyche_eval_metrics").set(value, {"task": task, "metric": metric})
            case _:
                pass

    def phase(self, name: str, state: CoordinatorState) -> AbstractContextManager[object]:
        """A span around one phase of the round runner (its `PhaseTracer`)."""
        return self.telemetry.span(name, step=state.progress.step, epoch=state.progress.epoch)

    def model_progress(self, downloaded: int, total: int) -> None:
        """`fetch_model(progress=...)`: percent of the parameters fetched from peers."""
        if total > 0:
            self.telemetry.gauge("psyche_p2p_model_params_downloaded").set(
                100.0 * downloaded / total)
