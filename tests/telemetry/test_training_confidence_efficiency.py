"""Psyche's `psyche_training_confidence` and `psyche_training_efficiency` (its StatsLogger,
shared/client/src/state/stats.rs): the formulas on known inputs, then the client's real
Prometheus endpoint scraped after Trained events from a client holding the tiny model."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from client_image.runtime.events import Trained
from client_image.telemetry import ClientTelemetry
from client_image.telemetry.training_stats import (
    WINDOW,
    TrainingStats,
    confidence,
    model_vocab_size,
)
from client_image.training.model import load_causal_lm
from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions
from psyche_common.telemetry.names import CLIENT_METRICS
from tests.client_runtime.standin_client import StandInClient
from tests.telemetry.test_client_telemetry_set import Clock, scrape

TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "tiny-llama"


def trained(step: int, loss: float, seconds: float, data_wait_s: float = 0.0) -> Trained:
    return Trained(step=step, epoch=0, loss=loss, batch=(step, step), payload_bytes=1,
                   seconds=seconds, tokens=64, data_wait_s=data_wait_s)


def test_confidence_is_one_minus_loss_over_the_vocabularys_bits() -> None:
    assert confidence(0.0, 4096) == 1.0
    assert confidence(6.0, 4096) == pytest.approx(0.5)  # log2(4096) = 12
    assert confidence(24.0, 4096) == pytest.approx(-1.0)  # worse than a uniform guess
    assert confidence(3.0, 1) is None and confidence(math.nan, 4096) is None


def test_efficiency_is_training_time_over_step_intervals_of_the_last_16() -> None:
    clock = Clock()
    stats = TrainingStats(lambda: 4096, clock)
    stats.on_trained(trained(1, 6.0, seconds=1.0))
    assert stats.efficiency is None  # one step end: no interval yet (Psyche: NaN)
    assert stats.confidence == pytest.approx(0.5)
    clock.now += 4.0
    stats.on_trained(trained(2, 3.0, seconds=1.5, data_wait_s=0.5))
    assert stats.efficiency == pytest.approx(2.0 / 4.0)  # step 2's 2 s of 4 s
    assert stats.confidence == pytest.approx(0.75)
    clock.now += 2.0
    stats.on_trained(trained(3, 3.0, seconds=2.0))
    assert stats.efficiency == pytest.approx((2.0 + 2.0) / (4.0 + 2.0))
    for step in range(4, 4 + WINDOW):  # the first steps leave the window
        clock.now += 10.0
        stats.on_trained(trained(step, 3.0, seconds=1.0))
    assert stats.efficiency == pytest.approx(0.1)


def test_vocab_size_comes_from_the_models_config() -> None:
    assert model_vocab_size(SimpleNamespace(config=SimpleNamespace(vocab_size=32000))) == 32000
    assert model_vocab_size(None) is None
    assert model_vocab_size(SimpleNamespace(config=SimpleNamespace(vocab_size=None))) is None


def test_both_are_registered_client_gauges() -> None:
    names = {spec.name: spec.kind for spec in CLIENT_METRICS}
    assert names["psyche_training_confidence"] == "observable_gauge"
    assert names["psyche_training_efficiency"] == "observable_gauge"


@pytest.fixture
def client_telemetry() -> Any:
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("client", "a1" * 32, "run"))
    yield telemetry
    telemetry.shutdown()


def test_the_client_exports_both_on_its_prometheus_endpoint(client_telemetry: Telemetry) -> None:
    client = StandInClient(observe=False)
    model = load_causal_lm(TINY_MODEL, device="cpu")  # vocab_size 4096: 12 bits
    client.worker = SimpleNamespace(model=model)  # type: ignore[attr-defined]  # the worker's one field read
    telemetry = ClientTelemetry(client_telemetry, client)  # type: ignore[arg-type]  # a stand-in client with only what telemetry reads
    telemetry.stats.clock = clock = Clock()
    series = scrape(client_telemetry)
    assert ("psyche_training_confidence", frozenset()) not in series  # nothing trained yet
    client.events.emit(trained(1, 6.0, seconds=1.0))
    clock.now += 5.0
    client.events.emit(trained(2, 3.0, seconds=0.75, data_wait_s=0.25))
    series = scrape(client_telemetry)
    assert series[("psyche_training_confidence", frozenset())] == pytest.approx(0.75)
    assert series[("psyche_training_efficiency", frozenset())] == pytest.approx(0.2)
