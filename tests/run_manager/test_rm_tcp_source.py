"""TcpCoordinatorSource against a real TCP coordinator server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from loopback import free_port
from tcp_run import RUN_ID, state_file

from coordinator import Coordinator, RunState, Witness, encode_state, selection_for_round
from coordinator.state import NodeIdentity
from coordinator_tcp import CoordinatorServer, ServerOptions
from coordinator_tcp.protocol import Challenge, StateUpdate, Welcome, encode
from psyche_common.run_view import ObservedState, RunSnapshot, build_snapshot
from psyche_common.tcp.framing import encode_frame, read_frame
from run_manager.runner import COORDINATOR_SOURCES, make_coordinator_source
from run_manager.settings import load_settings
from run_manager.sources import CoordinatorSource, CoordinatorUnavailable, TcpCoordinatorSource


def options(port: int = 0) -> ServerOptions:
    return ServerOptions(host="127.0.0.1", port=port, tick_interval_s=0.05,
                         heartbeat_interval_s=0.5, handshake_timeout_s=2.0)  # fmt: skip


@contextlib.asynccontextmanager
async def coordinator_server(version: str, port: int = 0) -> AsyncIterator[CoordinatorServer]:
    server = CoordinatorServer(Coordinator.from_state_file(state_file(version)), options(port))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_client_version_and_snapshot_of_a_waiting_run() -> None:
    async with coordinator_server("0.1.0") as server:
        source = TcpCoordinatorSource(f"127.0.0.1:{server.port}", RUN_ID, wait_s=10)
        try:
            assert isinstance(source, CoordinatorSource)
            assert await source.client_version() == "0.1.0"
            snapshot = await source.snapshot()
        finally:
            await source.close()
    assert snapshot is not None
    assert (snapshot.run_id, snapshot.phase, snapshot.client_version) == (RUN_ID, "WaitingForMembers", "0.1.0")
    assert snapshot.phase_timeout_s == 1.0  # waiting_for_members_extra_time
    assert (snapshot.epoch, snapshot.step, snapshot.clients) == (0, 1, [])
    # The observer is never offered to the coordinator as a client.
    assert server.pending == [] and server.state.epoch_state.clients == []


async def test_after_a_coordinator_restart_the_new_version_is_read_not_the_stale_one() -> None:
    port = free_port()
    source = TcpCoordinatorSource(f"127.0.0.1:{port}", RUN_ID, wait_s=15, max_backoff_s=0.5)
    try:
        async with coordinator_server("0.1.0", port):
            assert await source.client_version() == "0.1.0"
        async with coordinator_server("0.2.0", port):
            assert await source.client_version() == "0.2.0"
            assert source.connections == 2
    finally:
        await source.close()


async def test_an_unreachable_coordinator_is_named_in_the_error() -> None:
    port = free_port()  # nobody listens there
    source = TcpCoordinatorSource(f"127.0.0.1:{port}", RUN_ID, wait_s=0.6)
    try:
        with pytest.raises(CoordinatorUnavailable, match=rf"coordinator at 127\.0\.0\.1:{port}.*within 0\.6s.*ConnectionRefused"):
            await source.client_version()
        assert await source.snapshot() is None
    finally:
        await source.close()


async def test_a_wrong_run_id_is_reported_at_once() -> None:
    async with coordinator_server("0.1.0") as server:
        source = TcpCoordinatorSource(f"127.0.0.1:{server.port}", "another-run", wait_s=10)
        try:
            with pytest.raises(CoordinatorUnavailable, match="refused to show run 'another-run': WrongRunId"):
                await asyncio.wait_for(source.client_version(), 5)
        finally:
            await source.close()


async def test_an_undecodable_broadcast_is_skipped_and_the_next_good_one_kept() -> None:
    """A coordinator (or anything on that port) sending garbage never breaks the source."""
    good = encode_state(Coordinator.from_state_file(state_file("0.3.0")).state)
    sent_garbage = asyncio.Event()

    async def fake_coordinator(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(encode_frame(encode(Challenge(nonce=bytes(32)))))
        await read_frame(reader, 1 << 20)  # the observer's Join
        writer.write(encode_frame(encode(Welcome(identity=bytes(32)))))
        writer.write(encode_frame(encode(StateUpdate(state=base64.b64encode(b"\x01garbage").decode()))))
        await writer.drain()
        sent_garbage.set()
        await asyncio.sleep(0.3)
        writer.write(encode_frame(encode(StateUpdate(state=base64.b64encode(good).decode(), server_time=1))))
        await writer.drain()
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(fake_coordinator, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    source = TcpCoordinatorSource(f"127.0.0.1:{port}", RUN_ID, wait_s=10)
    try:
        version = asyncio.ensure_future(source.client_version())
        await asyncio.wait_for(sent_garbage.wait(), 5)
        await asyncio.sleep(0.1)
        assert source.observed is None and "undecodable state" in source.last_problem
        assert await asyncio.wait_for(version, 5) == "0.3.0"
    finally:
        await source.close()
        server.close()
        await server.wait_closed()


async def test_the_snapshot_says_how_many_clients_are_connected_while_the_run_waits() -> None:
    """The server tells its observers the clients connected and asking to take part (the
    state lists none before the warm-up); the clients' own updates leave that out."""
    from coordinator_tcp.client import ProtocolConnection
    from psyche_common.identity import Identity
    from psyche_common.ui.view import describe_run

    server = CoordinatorServer(Coordinator.from_state_file(state_file("0.1.0", init_min_clients=2)),
                               options())
    await server.start()
    source = TcpCoordinatorSource(f"127.0.0.1:{server.port}", RUN_ID, wait_s=10)

    async def joined_becomes(count: int) -> RunSnapshot:
        for _ in range(100):  # bounded: 5 s
            snapshot = await source.snapshot()
            if snapshot is not None and snapshot.joined == count:
                return snapshot
            await asyncio.sleep(0.05)
        raise AssertionError(f"joined never became {count}: {snapshot}")

    try:
        await source.client_version()
        first = await joined_becomes(0)
        assert (first.init_min_clients, first.phase) == (2, "WaitingForMembers")
        identity = Identity.generate()
        client, _ = await ProtocolConnection.connect(
            "127.0.0.1", server.port, identity, RUN_ID, f"{identity.node_id}@127.0.0.1:1")
        try:
            snapshot = await joined_becomes(1)
            assert describe_run(snapshot)[-1] == "waiting for 2 clients, 1 connected"
            update = await asyncio.wait_for(client.receive(), 5)
            assert isinstance(update, StateUpdate) and update.joined is None  # observers only
        finally:
            await client.close()
        await joined_becomes(0)  # it left: the observers hear so
        assert server.state.run_state is RunState.WaitingForMembers
    finally:
        await source.close()
        await server.stop()


def test_snapshot_lists_clients_elected_witnesses_and_quorum() -> None:
    """Driven through the real state machine: 3 clients, W = 1, one witness message."""
    coordinator = Coordinator.from_state_file(state_file("0.1.0", witness_nodes=1, init_min_clients=3))
    keys = [NodeIdentity(bytes([i]) * 32) for i in (1, 2, 3)]
    coordinator.tick(keys, now=1000, seed=7)
    coordinator.tick(keys, now=1002, seed=7)  # waiting_for_members_extra_time passed
    assert coordinator.state.run_state is RunState.Warmup
    coordinator.tick([], now=1030, seed=9)  # warmup_time passed
    state = coordinator.state
    assert state.run_state is RunState.RoundTrain

    observed = ObservedState(state, server_time=1033, received_monotonic=50.0, connection=1)
    snapshot = build_snapshot(observed, now_monotonic=51.5)
    assert snapshot.phase == "RoundTrain" and snapshot.phase_timeout_s == 10.0
    assert snapshot.phase_elapsed_s == pytest.approx(1033 + 1.5 - 1030)
    assert [c.id for c in snapshot.clients] == sorted(k.key.hex() for k in keys)
    assert {c.state for c in snapshot.clients} == {"Healthy"}
    [elected_index] = selection_for_round(state).witness_indices()
    elected = state.epoch_state.clients[elected_index].id
    assert snapshot.witnesses.elected == [elected.key.hex()]
    assert (snapshot.witnesses.received, snapshot.witnesses.quorum) == ([], 1)
    assert (snapshot.init_min_clients, snapshot.joined, snapshot.witnesses.target) == (3, None, 1)
    assert build_snapshot(ObservedState(state, 1033, 50.0, 1, joined=3)).joined == 3

    proof = selection_for_round(state).witness_of(elected_index)
    assert coordinator.witness(elected, Witness(proof), now=1034) is None
    after = build_snapshot(ObservedState(coordinator.state, 1034, 60.0, 1), now_monotonic=60.0)
    assert after.phase == "RoundWitness"
    assert after.witnesses.received == [elected.key.hex()] and after.witnesses.fraction == 1.0


def test_a_tcp_env_file_gets_the_tcp_source_without_a_pinned_version(tmp_path: object) -> None:
    from pathlib import Path

    env_file = Path(str(tmp_path)) / "run.env"
    env_file.write_text("RUN_ID=local-testnet\nCOORDINATOR_ADDRESS=127.0.0.1:20000\nCOORDINATOR_WAIT_S=3\n")
    settings = load_settings(env_file)
    source = make_coordinator_source(settings, None)
    assert "tcp" in COORDINATOR_SOURCES
    assert isinstance(source, TcpCoordinatorSource)
    assert (source.address, source.run_id, source.wait_s) == ("127.0.0.1:20000", "local-testnet", 3.0)


async def test_the_tui_run_panel_shows_a_real_tcp_coordinator() -> None:
    """The monitor polls TcpCoordinatorSource into the TUI (no container: no supervisor)."""
    from textual.widgets import DataTable, Static

    from coordinator_tcp.client import ProtocolConnection
    from psyche_common.identity import Identity
    from run_manager.monitor import Monitor, Part
    from run_manager.tui.app import RunManagerApp
    from run_manager.view import Dashboard

    async with coordinator_server("0.1.0") as server:
        source = TcpCoordinatorSource(f"127.0.0.1:{server.port}", RUN_ID, wait_s=10)
        dashboard = Dashboard()

        def make_monitor(on_change: Callable[[Part], None]) -> Monitor:
            return Monitor(dashboard, source, None, on_change, interval_s=0.1)

        app = RunManagerApp(dashboard, None, make_monitor)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                for _ in range(100):  # bounded: 10 s
                    summary = str(app.query_one("#run-summary", Static).render())
                    if "WaitingForMembers" in summary:
                        break
                    await pilot.pause(0.1)
                assert f"run {RUN_ID}: WaitingForMembers 00:00 / 00:01" in summary
                assert "epoch 0  step 1  clients 0/0 healthy" in summary
                assert "waiting for 1 client, 0 connected" in summary
                assert app.query_one("#run-clients", DataTable).row_count == 0

                # A client joins for real: after waiting_for_members_extra_time, Warmup.
                identity = Identity.generate()
                client, _ = await ProtocolConnection.connect(
                    "127.0.0.1", server.port, identity, RUN_ID, f"{identity.node_id}@127.0.0.1:1")
                try:
                    for _ in range(100):  # bounded: 10 s
                        summary = str(app.query_one("#run-summary", Static).render())
                        if "Warmup" in summary:
                            break
                        await pilot.pause(0.1)
                    assert "Warmup" in summary and "clients 1/1 healthy" in summary
                    assert "warming up: 0 of 1 ready" in summary
                    table = app.query_one("#run-clients", DataTable)
                    assert table.get_row(identity.public_key.hex())[1] == "Healthy"
                finally:
                    await client.close()
        finally:
            await source.close()
