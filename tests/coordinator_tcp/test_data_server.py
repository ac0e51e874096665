"""The TCP data server and the client's TcpDataProvider, on loopback, with the bundled tokens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch
from tcp_helpers import RUN_ID, TESTNET, identity

from client_image.data import DataProviderError, LocalDataProvider
from client_image.data.tcp_provider import DataServerMismatch, TcpDataProvider
from coordinator.config import SeededShuffle, load_data_config
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.data_protocol import (
    DataRejected,
    DataRequest,
    DataResponse,
    DataWelcome,
    decode_data_server_message,
)
from coordinator_tcp.data_server import DataServer, DataServerOptions
from coordinator_tcp.protocol import ErrorReply
from psyche_common.identity import Identity
from psyche_common.tcp.connection import Connection

CONFIG = load_data_config(TESTNET / "data.toml")
MEMBER, OUTSIDER = identity(1), identity(2)


@pytest.fixture(scope="module")
def reference() -> LocalDataProvider:
    return LocalDataProvider(CONFIG.dir, CONFIG.seq_len, CONFIG.token_size,
                             SeededShuffle(seed=CONFIG.shuffle_seed))


@pytest.fixture
async def data_server() -> AsyncIterator[tuple[DataServer, set[bytes]]]:
    members = {MEMBER.public_key}
    server = DataServer(CONFIG, RUN_ID, members=lambda: members,
                        options=DataServerOptions(host="127.0.0.1", port=0,
                                                  handshake_timeout_s=2))
    await server.start()
    yield server, members
    await server.stop()


async def connect(server: DataServer,
                  who: Identity = MEMBER) -> tuple[Connection, DataWelcome]:
    return await ProtocolConnection.connect(
        "127.0.0.1", server.port, who, RUN_ID, decode=decode_data_server_message,
        expect_welcome=DataWelcome, timeout_s=5)


async def test_serves_the_seeded_shuffle_of_local_data(
        data_server: tuple[DataServer, set[bytes]], reference: LocalDataProvider) -> None:
    server, _ = data_server
    connection, welcome = await connect(server)
    assert welcome.num_sequences == reference.num_sequences > 1000
    assert welcome.seq_len == 128
    for start, end in [(0, 0), (5, 16), (reference.num_sequences - 3, reference.num_sequences - 1)]:
        await connection.send(DataRequest(start=start, end=end))
        reply = await connection.receive()
        assert isinstance(reply, DataResponse)
        assert torch.equal(reply.samples(128), reference.get_samples(start, end))
    # The shuffle really happened: sample 0 is not the first sequence of the first file.
    unshuffled = LocalDataProvider(CONFIG.dir, CONFIG.seq_len, CONFIG.token_size)
    assert not torch.equal(reference.get_samples(0, 3), unshuffled.get_samples(0, 3))
    assert server.samples_served[MEMBER.node_id] == 1 + 12 + 3
    await connection.close()


async def test_rejects_non_members_and_bad_ranges(
        data_server: tuple[DataServer, set[bytes]]) -> None:
    server, members = data_server
    outsider, _ = await connect(server, OUTSIDER)
    await outsider.send(DataRequest(start=0, end=1))
    reply = await outsider.receive()
    assert isinstance(reply, DataRejected) and reply.reason == "NotInThisRound"
    members.add(OUTSIDER.public_key)  # joins the epoch: the same connection now gets data
    await outsider.send(DataRequest(start=0, end=1))
    assert isinstance(await outsider.receive(), DataResponse)
    await outsider.send(DataRequest(start=server.num_sequences, end=server.num_sequences + 2))
    reply = await outsider.receive()
    assert isinstance(reply, DataRejected) and reply.reason == "OutOfRange"
    assert "out of range" in reply.detail
    await outsider.send(DataRequest(start=5, end=2))
    reply = await outsider.receive()
    assert isinstance(reply, DataRejected) and reply.reason == "OutOfRange"
    await outsider.send(DataRequest(start=0, end=10**9))
    reply = await outsider.receive()
    assert isinstance(reply, DataRejected) and reply.reason == "TooLarge"
    await outsider.close()


async def test_garbage_gets_an_error_and_a_disconnect(
        data_server: tuple[DataServer, set[bytes]]) -> None:
    server, _ = data_server
    connection, _ = await connect(server)
    await connection.send_raw(b'{"type": "data_request", "version": 3, "start": -1, "end": 2}')
    reply = await connection.receive()
    assert isinstance(reply, ErrorReply) and reply.fatal and "start" in reply.detail
    with pytest.raises(asyncio.IncompleteReadError):
        await connection.receive()
    await connection.close()
    # An oversized frame before the join, then a silent peer: both dropped, server fine.
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    await reader.readexactly(4)
    writer.write(b"\x7f\xff\xff\xff")
    await writer.drain()
    assert b"exceeds the limit" in await asyncio.wait_for(reader.read(), 5)
    writer.close()
    good, _ = await connect(server)
    await good.send(DataRequest(start=1, end=1))
    assert isinstance(await good.receive(), DataResponse)
    await good.close()
    assert server.protocol_errors == 2


async def test_tcp_provider_round_trip(data_server: tuple[DataServer, set[bytes]],
                                       reference: LocalDataProvider) -> None:
    server, _ = data_server
    provider = await TcpDataProvider.open(f"127.0.0.1:{server.port}", MEMBER, RUN_ID, 128,
                                          retry_delay_s=0.01)
    assert provider.num_sequences == reference.num_sequences
    batches = await asyncio.gather(provider.fetch(10, 13), provider.fetch(100, 100))
    assert torch.equal(batches[0], reference.get_samples(10, 13))
    assert torch.equal(batches[1], reference.get_samples(100, 100))
    assert batches[0].dtype == torch.int64 and batches[0].shape == (4, 128)
    await provider.aclose()


async def test_tcp_provider_retries_until_admitted(
        data_server: tuple[DataServer, set[bytes]], reference: LocalDataProvider) -> None:
    server, members = data_server
    provider = await TcpDataProvider.open(f"127.0.0.1:{server.port}", OUTSIDER, RUN_ID, 128,
                                          attempts=7, retry_delay_s=0.05)

    async def admit_later() -> None:
        await asyncio.sleep(0.08)  # after the first two attempts
        members.add(OUTSIDER.public_key)

    admit = asyncio.create_task(admit_later())
    batch = await provider.fetch(3, 4)
    await admit
    assert torch.equal(batch, reference.get_samples(3, 4))
    assert server.rejections >= 1
    await provider.aclose()


async def test_tcp_provider_gives_up_with_a_clear_error(
        data_server: tuple[DataServer, set[bytes]]) -> None:
    server, _ = data_server
    provider = await TcpDataProvider.open(f"127.0.0.1:{server.port}", OUTSIDER, RUN_ID, 128,
                                          attempts=3, retry_delay_s=0.01)
    with pytest.raises(DataProviderError, match=r"failed after 3 attempts.*NotInThisRound"):
        await provider.fetch(0, 0)
    await provider.aclose()
    with pytest.raises(DataServerMismatch, match="WrongRunId"):
        await TcpDataProvider.open(f"127.0.0.1:{server.port}", MEMBER, "other", 128)
    with pytest.raises(DataServerMismatch, match="samples of 128 tokens"):
        await TcpDataProvider.open(f"127.0.0.1:{server.port}", MEMBER, RUN_ID, 64)
    with pytest.raises(DataProviderError, match="host:port"):
        TcpDataProvider("nonsense", MEMBER, RUN_ID, 128)


async def test_tcp_provider_reconnects_after_a_server_restart(
        reference: LocalDataProvider) -> None:
    members = {MEMBER.public_key}
    first = DataServer(CONFIG, RUN_ID, lambda: members,
                       DataServerOptions(host="127.0.0.1", port=0))
    await first.start()
    port = first.port
    provider = await TcpDataProvider.open(f"127.0.0.1:{port}", MEMBER, RUN_ID, 128,
                                          retry_delay_s=0.05)
    await first.stop()
    second = DataServer(CONFIG, RUN_ID, lambda: members,
                        DataServerOptions(host="127.0.0.1", port=port))
    await second.start()
    try:
        assert torch.equal(await provider.fetch(7, 8), reference.get_samples(7, 8))
    finally:
        await provider.aclose()
        await second.stop()
