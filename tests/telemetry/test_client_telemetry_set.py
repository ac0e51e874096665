"""Psyche's client telemetry set, each value against what it must be: the process's own
memory and CPU, the bandwidth from known byte counts, the lr of a real DisTrO step of
the tiny model, the global batch, the previous round's counts, lost downloads, and the
coordinator's phase durations. A real Prometheus endpoint is scraped each time."""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from client_image.p2p.blobs import DownloadStats
from client_image.runtime.events import DownloadFailed, TaskFailed, Trained
from client_image.telemetry import ClientTelemetry
from client_image.telemetry.system import SystemSampler, download_rate, nvml_gpus
from client_image.training.lr import scheduled_lr
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer
from coordinator import Coordinator, RunState, load_state_file
from coordinator.config import ConstantLR, DistroOptimizer
from coordinator_tcp.server import CoordinatorServer, ServerOptions
from coordinator_tcp.telemetry import CoordinatorTelemetry
from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions
from psyche_common.telemetry.names import GPU_ONLY_METRICS
from tests.client_runtime.standin_client import StandInClient

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "assets" / "tiny-llama"
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(telemetry: Telemetry) -> Series:
    assert telemetry.prometheus is not None
    text = httpx.get(f"http://127.0.0.1:{telemetry.prometheus.port}/metrics", timeout=5).text
    return {(s.name, frozenset((k, v) for k, v in s.labels.items()
                               if k not in ("run_id", "service_name", "service_instance_id"))):
            s.value for family in text_string_to_metric_families(text) for s in family.samples}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client_telemetry() -> Any:
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("client", "a1" * 32, "run"))
    yield telemetry
    telemetry.shutdown()


def test_download_rate_is_bytes_over_seconds() -> None:
    assert download_rate((10.0, 1_000), (15.0, 6_000)) == 1_000.0
    assert download_rate(None, (15.0, 6_000)) is None
    assert download_rate((15.0, 6_000), (15.0, 7_000)) is None  # no window yet
    assert download_rate((10.0, 6_000), (12.0, 0)) == 0.0  # a reset counter is no negative rate


def test_sampler_measures_this_process_and_samples_every_interval() -> None:
    stats, clock = DownloadStats(bytes_received=1_000), Clock()
    sampler = SystemSampler(lambda: stats.bytes_received, clock=clock)
    ballast = bytearray(64 << 20)  # 64 MiB the RSS must include
    ballast[::4096] = b"x" * len(ballast[::4096])
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # busy: CPU time for the window
        pass
    first = sampler.latest()
    rss = psutil.Process().memory_info().rss
    assert abs(first.rss_bytes - rss) < 16 << 20 and first.rss_bytes > 64 << 20
    assert first.cpu_percent > 10.0, first
    assert first.bytes_per_second is None  # no time has passed on this clock

    stats.bytes_received += 50_000
    clock.now += 2.0
    assert sampler.latest() is first  # within the 5 s interval: the same sample
    clock.now += 3.0
    second = sampler.latest()
    assert second is not first and second.bytes_per_second == 50_000 / 5.0
    del ballast


def test_gpu_series_exist_only_with_cuda(client_telemetry: Telemetry) -> None:
    client = StandInClient(observe=False)
    ClientTelemetry(client_telemetry, client)  # type: ignore[arg-type]  # a stand-in client
    names = {name for name, _ in scrape(client_telemetry)}
    assert {"psyche_cpu_usage_percent", "psyche_memory_usage_bytes"} <= names
    if torch.cuda.is_available():  # a GPU machine: one series per device
        assert nvml_gpus() is not None and names >= GPU_ONLY_METRICS
    else:  # here: no made-up GPU values
        assert nvml_gpus() is None and not GPU_ONLY_METRICS & names


def test_memory_and_bandwidth_gauges_scrape_the_sampled_values(
        client_telemetry: Telemetry) -> None:
    client, clock = StandInClient(observe=False), Clock()
    stats = client.node.stats
    sampler = SystemSampler(lambda: stats.bytes_received, clock=clock)
    ClientTelemetry(client_telemetry, client, sampler)  # type: ignore[arg-type]  # a stand-in client with only what telemetry reads
    stats.bytes_received = 3_000_000
    clock.now += 6.0
    series = scrape(client_telemetry)
    assert series[("psyche_bandwidth_bytes_per_second", frozenset())] == 500_000.0
    rss = psutil.Process().memory_info().rss
    assert abs(series[("psyche_memory_usage_bytes", frozenset())] - rss) < 16 << 20
    assert series[("psyche_cpu_usage_percent", frozenset())] >= 0.0


def test_a_real_distro_step_reports_the_schedules_lr_grad_norm_and_batch(
        client_telemetry: Telemetry) -> None:
    schedule = ConstantLR(base_lr=1e-3, warmup_init_lr=1e-4, warmup_steps=4)
    optimizer = DistroOptimizer(compression_decay=0.999, compression_topk=8,
                                compression_chunk=64, quantize_1bit=False,
                                clip_grad_norm=1.0, weight_decay=0.1)
    model = load_causal_lm(TINY_MODEL, device="cpu")
    trainer = DistroTrainer(model, optimizer, schedule, micro_batch_size=2)
    batch = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    out = trainer.train(2, batch, batch_id=(4, 5))
    assert out.learning_rate == scheduled_lr(schedule, 2) == trainer.learning_rate(2)
    assert 1e-4 < out.learning_rate < 1e-3  # mid-warmup: neither end of the schedule
    assert math.isfinite(out.grad_norm) and out.grad_norm > 0

    client = StandInClient(observe=False)
    ClientTelemetry(client_telemetry, client)  # type: ignore[arg-type]  # a stand-in client with only what telemetry reads
    # Three trainers' batches of 2, 2 and 4 sequences of 32 tokens: a 256-token global batch.
    client.events.emit(Trained(step=2, epoch=0, loss=out.loss, batch=(4, 5), payload_bytes=10,
                               seconds=0.5, tokens=64, learning_rate=out.learning_rate,
                               grad_norm=out.grad_norm, batch_tokens=8 * 32))
    series = scrape(client_telemetry)
    assert series[("psyche_learning_rate", frozenset())] == pytest.approx(out.learning_rate)
    assert series[("psyche_token_batch_size", frozenset())] == 256
    assert series[("psyche_optimizer_stats", frozenset({("stat", "grad_norm")}))] == \
        pytest.approx(out.grad_norm)


def test_previous_round_counts_lost_downloads_and_failed_model_fetches(
        client_telemetry: Telemetry) -> None:
    client = StandInClient(observe=False)
    ClientTelemetry(client_telemetry, client)  # type: ignore[arg-type]  # a stand-in client with only what telemetry reads
    counters = client.counters
    counters.finishes_previous, counters.announcements_previous = 3, 4
    counters.downloaded_previous = 2
    for _ in range(2):
        client.events.emit(DownloadFailed(step=5, batch=(0, 1), error="every provider failed"))
    client.events.emit(TaskFailed(task="warmup", error="no peer served it",
                                  error_type="ModelFetchFailed"))
    client.events.emit(TaskFailed(task="warmup", error="none of them is in this epoch",
                                  error_type="ModelUnavailable"))  # nobody was asked
    series = scrape(client_telemetry)
    assert series[("psyche_finishes_received_previous_round", frozenset())] == 3
    assert series[("psyche_result_announcements_received_previous_round", frozenset())] == 4
    assert series[("psyche_results_downloaded_previous_round", frozenset())] == 2
    assert series[("psyche_downloads_perma_failed_total", frozenset())] == 2
    assert series[("psyche_p2p_params_download_failed_counter_total", frozenset())] == 1


def test_coordinator_times_each_phase_it_saw_begin() -> None:
    state_file = REPO / "config" / "local-testnet" / "state.toml"
    server = CoordinatorServer(Coordinator.from_state_file(load_state_file(state_file)),
                               ServerOptions(port=0))
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("coordinator", "server", "local-testnet"))
    try:
        CoordinatorTelemetry(telemetry, server)
        state = copy.deepcopy(server.state)
        pauses = {RunState.Warmup: 0.05, RunState.RoundTrain: 0.12, RunState.RoundWitness: 0.02}
        for run_state, step in [(RunState.Warmup, 1), (RunState.RoundTrain, 1),
                                (RunState.RoundWitness, 1), (RunState.RoundTrain, 2),
                                (RunState.Cooldown, 2)]:
            state.run_state, state.progress.step = run_state, step
            for callback in server.on_change:
                callback(state)
            time.sleep(pauses.get(run_state, 0.0))
        durations = {dict(labels)["phase"]: value for (name, labels), value
                     in scrape(telemetry).items()
                     if name == "psyche_coordinator_phase_duration_seconds"}
        # WaitingForMembers began before the server did: not timed. RoundTrain: step 2's.
        assert set(durations) == {"Warmup", "RoundTrain", "RoundWitness"}
        assert 0.05 <= durations["Warmup"] < 1.0
        assert 0.12 <= durations["RoundTrain"] < 1.0
        assert 0.02 <= durations["RoundWitness"] < durations["RoundTrain"]
    finally:
        telemetry.shutdown()
