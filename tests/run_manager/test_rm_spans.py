"""The run-manager's spans (run_manager/tracing.py): a real Supervisor pulls a published
image from a registry on loopback through the real Docker engine, starts it and stops it;
the spans are read with the OpenTelemetry SDK's own in-memory exporter attached to the
run-manager's Telemetry (the same tracer provider its OTLP exporter uses)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions
from run_manager.docker_supervisor import (
    ContainerStarted,
    LogLine,
    Supervisor,
    SupervisorConfig,
    SupervisorEvent,
)
from run_manager.sources import PinnedVersionSource
from run_manager.telemetry import RunManagerTelemetry
from tests.run_manager.local_registry import LocalRegistry, publish_tiny_client, remove_images

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_containers")]


@pytest.fixture
def traced() -> Iterator[tuple[RunManagerTelemetry, InMemorySpanExporter]]:
    telemetry = Telemetry.start(TelemetryOptions(),
                                ServiceIdentity("run-manager", "wallet-a", "run"))
    spans = InMemorySpanExporter()
    telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    yield RunManagerTelemetry(telemetry), spans
    telemetry.shutdown()


def config(registry: LocalRegistry, run_id: str) -> SupervisorConfig:
    # The stand-in image has /bin/sh and nothing else (no sleep): it says it is up, then
    # spins until the stop's SIGTERM (a second or two: the test stops it once it is up).
    return SupervisorConfig(
        run_id=run_id, image_repository=f"{registry.address}/psyche-client",
        environment={"RUN_ID": run_id}, entrypoint=["/bin/sh"],
        command=["-c", "trap 'exit 0' TERM; echo up; while :; do :; done"], stop_timeout_s=2,
        max_crash_restarts=0)


async def test_pull_start_and_stop_of_the_container_are_spans(
    docker_client: docker.DockerClient, loopback_registry: LocalRegistry, run_id: str,
    traced: tuple[RunManagerTelemetry, InMemorySpanExporter], tmp_path: Path,
) -> None:  # fmt: skip
    version = f"1.0.0-{run_id}"
    # removed from the engine once published: the supervisor must pull it
    image, digest = publish_tiny_client(docker_client, loopback_registry, tmp_path,
                                        f"psyche-spans-test:{version}", payload_mb=2)
    observer, spans = traced
    events: list[SupervisorEvent] = []
    supervisor = Supervisor(docker_client, PinnedVersionSource(version),
                            config(loopback_registry, run_id), observer.wrap(events.append))
    supervisor.tracing = observer.tracing
    try:
        task = asyncio.ensure_future(supervisor.run())
        for _ in range(600):
            if LogLine("up") in events:
                break
            await asyncio.sleep(0.1)
        supervisor.request_stop()
        finished = await asyncio.wait_for(task, timeout=60)
    finally:
        remove_images(docker_client, image)
    assert finished.reason == "stopped", finished.message
    [started] = [e for e in events if isinstance(e, ContainerStarted)]

    pull, start, stop = spans.get_finished_spans()
    assert [pull.name, start.name, stop.name] == [
        "run_manager.pull", "run_manager.start", "run_manager.stop"]
    assert dict(pull.attributes or {}) == {
        "psyche.image": image, "psyche.pull": True, "psyche.digest": digest}
    assert dict(start.attributes or {}) == {
        "psyche.image": image, "psyche.version": version, "psyche.restarts": 0,
        "psyche.container_id": started.container_id}
    assert dict(stop.attributes or {}) == {
        "psyche.container_id": started.container_id, "psyche.reason": "stop",
        "psyche.timeout_s": 2}
    assert all(s.status.status_code is StatusCode.UNSET for s in (pull, start, stop))
    times = [t or 0 for s in (pull, start, stop) for t in (s.start_time, s.end_time)]
    assert 0 not in times and times == sorted(times)  # one after the other
    assert stop.resource.attributes["service.name"] == "psyche-run-manager"


async def test_a_pull_that_fails_is_an_error_span(
    docker_client: docker.DockerClient, loopback_registry: LocalRegistry, run_id: str,
    traced: tuple[RunManagerTelemetry, InMemorySpanExporter],
) -> None:  # fmt: skip
    observer, spans = traced
    supervisor = Supervisor(docker_client, PinnedVersionSource("9.9.9-missing"),
                            config(loopback_registry, run_id), observer.wrap(lambda _: None))
    supervisor.tracing = observer.tracing
    finished = await asyncio.wait_for(supervisor.run(), timeout=60)
    assert finished.reason == "no-image"
    [pull] = spans.get_finished_spans()
    assert pull.name == "run_manager.pull"
    assert pull.attributes is not None
    assert pull.attributes["psyche.image"] == (
        f"{loopback_registry.address}/psyche-client:9.9.9-missing")
    assert pull.status.status_code is StatusCode.ERROR
    assert [e.name for e in pull.events] == ["exception"]
