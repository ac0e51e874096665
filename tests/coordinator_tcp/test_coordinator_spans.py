"""The TCP coordinator's spans (coordinator_tcp/tracing.py): a real server on loopback,
real clients joining over TCP and sending witnesses, and the spans read with the
OpenTelemetry SDK's own in-memory exporter attached to the coordinator's Telemetry (the
tracer provider its OTLP exporter uses). A tick makes a span only when it moves the run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from tcp_helpers import Clock, identity, join, make_state_file, server_options, wait_for

from coordinator import Coordinator, RunState, Witness, selection_for_round
from coordinator_tcp.protocol import WitnessModel, WitnessSubmit, encode
from coordinator_tcp.server import CoordinatorServer
from coordinator_tcp.telemetry import CoordinatorTelemetry
from psyche_common.tcp.framing import encode_frame
from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions

CLIENTS = 2


@pytest.fixture
def spans() -> Iterator[tuple[Telemetry, InMemorySpanExporter]]:
    telemetry = Telemetry.start(TelemetryOptions(),
                                ServiceIdentity("coordinator", "server", "local-testnet"))
    exporter = InMemorySpanExporter()
    telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield telemetry, exporter
    telemetry.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[dict[str, Any]]:
    return [dict(s.attributes or {}) for s in exporter.get_finished_spans() if s.name == name]


def ticks(exporter: InMemorySpanExporter) -> list[tuple[str, str]]:
    return [(a["psyche.from_run_state"], a["psyche.run_state"])
            for a in named(exporter, "coordinator.tick")]


async def test_joins_state_changing_ticks_and_witnesses_are_spans(
        spans: tuple[Telemetry, InMemorySpanExporter]) -> None:
    telemetry, exporter = spans
    clock = Clock()
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file(
        init_min_clients=CLIENTS, min_clients=CLIENTS, witness_nodes=CLIENTS)),
        server_options(), clock=clock)
    CoordinatorTelemetry(telemetry, server)
    await server.start()
    connections = []
    try:
        connections.extend([await join(server, identity(i)) for i in range(1, CLIENTS + 1)])
        await wait_for(lambda: server.state.run_state is RunState.Warmup)
        await asyncio.sleep(0.3)  # several ticks that change nothing: no span of them
        assert ticks(exporter) == [("WaitingForMembers", "Warmup")]
        joins = named(exporter, "coordinator.join")
        assert [j["psyche.client"] for j in joins] == [
            identity(i).public_key.hex() for i in (1, 2)]
        assert joins[0] == {"psyche.client": identity(1).public_key.hex(),
                            "psyche.p2p_address": f"{identity(1).node_id}@127.0.0.1:1",
                            "psyche.run_state": "WaitingForMembers", "psyche.listed": False,
                            "psyche.pending": 1}
        assert joins[1]["psyche.pending"] == 2

        clock.now += 3  # the warm-up times out: the first round starts
        await wait_for(lambda: server.state.run_state is RunState.RoundTrain)
        await asyncio.sleep(0.3)
        assert ticks(exporter) == [("WaitingForMembers", "Warmup"), ("Warmup", "RoundTrain")]
        first_round = named(exporter, "coordinator.tick")[-1]
        assert first_round["psyche.clients"] == CLIENTS and first_round["psyche.result"] == "ok"
        assert first_round["psyche.step"] == server.state.progress.step

        selection = selection_for_round(server.state)
        listed = [c.id.key for c in server.state.epoch_state.clients]
        by_key = {identity(i).public_key: c for i, c in enumerate(connections, start=1)}
        index = next(iter(selection.witness_indices()))
        message = encode_frame(encode(WitnessSubmit(
            witness=WitnessModel.of(Witness(selection.witness_of(index))))))
        by_key[listed[index]].writer.write(message)
        await wait_for(lambda: len(named(exporter, "coordinator.witness")) == 1)
        by_key[listed[index]].writer.write(message)  # the same witness again: refused
        await wait_for(lambda: len(named(exporter, "coordinator.witness")) == 2)
    finally:
        for connection in connections:
            await connection.close()
        await server.stop()

    accepted, refused = (s for s in exporter.get_finished_spans()
                         if s.name == "coordinator.witness")
    assert dict(accepted.attributes or {}) == {
        "psyche.client": listed[index].hex(), "psyche.kind": "round",
        "psyche.run_state": "RoundTrain", "psyche.epoch": server.state.progress.epoch,
        "psyche.step": first_round["psyche.step"], "psyche.accepted": True,
        "psyche.witnesses": 1}
    assert accepted.status.status_code is StatusCode.UNSET
    assert refused.attributes is not None and refused.attributes["psyche.accepted"] is False
    assert refused.attributes["psyche.error"] == "DuplicateWitness"
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.status.description == (
        "DuplicateWitness: this client already witnessed the round")
    every: tuple[ReadableSpan, ...] = exporter.get_finished_spans()
    assert {s.resource.attributes["service.name"] for s in every} == {"psyche-coordinator"}
