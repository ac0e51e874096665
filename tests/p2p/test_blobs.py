"""Verified blob transfer between real iroh endpoints on loopback."""

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence

import iroh
import pytest

from client_image.p2p import (
    BLOBS_ALPN,
    BlobDownloadError,
    BlobStore,
    DownloadConfig,
    Identity,
    NodeConfig,
    P2PNode,
    RateLimiter,
    blob_hash,
    framing,
    step_tag,
)
from client_image.p2p.blobs import REQUEST, RESPONSE_HEADER, STATUS_OK
from client_image.p2p.transport import Transport

from .swarm import FAST_DOWNLOADS, started_nodes, wait_until

pytestmark = pytest.mark.timeout(90)  # a hang fails fast instead of blocking CI

Responder = Callable[[bytes, int], bytes]  # (requested hash, offset) -> raw response body


def test_store_garbage_collects_by_tag_and_step() -> None:
    store = BlobStore()
    shared = store.add(b"same bytes", tag=step_tag("distro-result", 4))
    assert store.add(b"same bytes", tag="model-embed") == shared == blob_hash(b"same bytes")
    old = store.add(b"old result", tag=step_tag("distro-result", 3))
    new = store.add(b"new result", tag=step_tag("downloaded-distro-result-ab", 5))
    assert store.remove_steps_before(5) == 1  # only "old result" had no other tag
    assert old not in store and shared in store and new in store
    assert store.remove_tag("model-embed") == 1
    assert shared not in store and len(store) == 1 and store.total_bytes == len(b"new result")


@contextlib.asynccontextmanager
async def fake_provider(respond: Responder) -> AsyncIterator[Transport]:
    """A peer that speaks the blob protocol but answers what ``respond`` says."""
    transport = Transport(Identity.generate(), NodeConfig.loopback())

    async def handle(connection: iroh.Connection) -> None:
        with contextlib.suppress(iroh.IrohError, framing.StreamClosed):
            while True:
                stream = await connection.accept_bi()
                digest, offset, _ = REQUEST.unpack(
                    await framing.read_exact(stream.recv(), REQUEST.size)
                )
                await stream.send().write_all(respond(digest, offset))
                await stream.send().finish()

    transport.register_protocol(BLOBS_ALPN, handle)
    await transport.start()
    try:
        yield transport
    finally:
        await transport.stop()


def header(size: int) -> bytes:
    return RESPONSE_HEADER.pack(STATUS_OK, size)


async def test_download_verifies_and_serves_from_any_provider() -> None:
    data = os.urandom(3 << 20)
    async with started_nodes(3) as (a, b, downloader):
        digest = a.blob_store.add(data, tag=step_tag("distro-result", 1))
        b.blob_store.add(data, tag=step_tag("distro-result", 1))
        downloader.add_peer_addresses([a.address, b.address])
        assert await downloader.blobs.download(digest, len(data), [a.node_id, b.node_id]) == data
        assert downloader.blobs.stats.finished == 1 and downloader.blobs.stats.retries == 0
        peers = {d.peer: d for d in downloader.diagnostics()}
        served = next(p for p in (a.node_id, b.node_id) if p in peers)
        assert peers[served].connection_type == "direct"
        assert peers[served].bytes_received >= len(data)
        assert peers[served].rtt_ms is not None


async def test_corrupted_stream_is_rejected_and_an_honest_provider_used() -> None:
    data = os.urandom(200_000)
    corrupted = bytearray(data)
    corrupted[123_456] ^= 0x01
    async with (
        fake_provider(lambda d, o: header(len(data)) + bytes(corrupted)[o:]) as liar,
        started_nodes(2) as (honest, downloader),
    ):
        digest = honest.blob_store.add(data)
        downloader.add_peer_addresses([liar.address, honest.address])
        with pytest.raises(BlobDownloadError, match="does not match the hash"):
            await downloader.blobs.download(digest, len(data), [liar.node_id])
        fetched, provider = await downloader.blobs.fetch(
            digest, len(data), [liar.node_id, honest.node_id]
        )
        assert fetched == data and provider == honest.node_id


async def test_truncated_oversized_and_missing_streams_are_rejected() -> None:
    data = os.urandom(100_000)
    digest = blob_hash(data)
    cases = {
        "stream ended at 50000": lambda d, o: header(len(data)) + data[o:50_000],
        "more than the announced": lambda d, o: header(len(data)) + data[o:] + b"extra",
        "says 99999 bytes": lambda d, o: header(99_999) + data[o:99_999],
        "does not have the blob": lambda d, o: RESPONSE_HEADER.pack(1, 0),
    }
    quick = DownloadConfig(max_attempts=2, backoff_base_s=0.02, read_timeout_s=2)
    async with started_nodes(1, download_config=quick) as (downloader,):
        for message, respond in cases.items():
            async with fake_provider(respond) as bad:
                downloader.add_peer_addresses([bad.address])
                with pytest.raises(BlobDownloadError, match=message):
                    await downloader.blobs.download(digest, len(data), [bad.node_id])
        assert digest not in downloader.blob_store


async def test_size_limit_and_no_tight_retry_loop() -> None:
    config = DownloadConfig(
        max_blob_bytes=1000, max_attempts=4, backoff_base_s=0.05, read_timeout_s=2
    )
    async with started_nodes(2, download_config=config) as (empty, downloader):
        downloader.add_peer_addresses([empty.address])
        with pytest.raises(BlobDownloadError, match="exceeds the limit of 1000"):
            await downloader.blobs.download(bytes(32), 1001, [empty.node_id])
        started = time.monotonic()
        with pytest.raises(BlobDownloadError, match="after 4 attempts"):
            await downloader.blobs.download(bytes(32), 10, [empty.node_id])
        # three pauses of at least base·2^k/2 (k = 0, 1, 2) between the four attempts
        assert time.monotonic() - started >= 0.05 * (1 + 2 + 4) / 2
        assert downloader.blobs.stats.retries == 4 and downloader.blobs.stats.failed == 1


async def test_download_survives_its_provider_dying_mid_transfer() -> None:
    data = os.urandom(24 << 20)
    async with started_nodes(3, download_config=FAST_DOWNLOADS) as (doomed, backup, downloader):
        digest = doomed.blob_store.add(data)
        backup.blob_store.add(data)
        downloader.add_peer_addresses([doomed.address, backup.address])
        limiter = RateLimiter(24e6)  # ~1 s for the blob: time to kill the first provider
        task = asyncio.create_task(
            downloader.blobs.fetch(digest, len(data), [doomed.node_id, backup.node_id], limiter)
        )
        await wait_until(
            lambda: downloader.blobs.stats.bytes_received > 4 << 20, what="the transfer to start"
        )
        await doomed.stop()
        fetched, provider = await asyncio.wait_for(task, 30)
        assert fetched == data and provider == backup.node_id
        assert downloader.blobs.stats.retries >= 1
        # resumed, not restarted: little more than the blob itself crossed the wire
        assert downloader.blobs.stats.bytes_received < len(data) + (4 << 20)


async def test_parallel_streams_spread_one_blob_over_providers_and_survive_a_liar() -> None:
    data = os.urandom(4 << 20)
    parallel = DownloadConfig(
        parallel_streams=4, parallel_min_bytes=1 << 20, backoff_base_s=0.02, read_timeout_s=3
    )
    corrupted = bytes(b ^ 0xFF for b in data[:1000]) + data[1000:]
    async with (
        fake_provider(lambda d, o: header(len(data)) + corrupted[o:]) as liar,
        started_nodes(3, download_config=parallel) as (a, b, downloader),
    ):
        digest = a.blob_store.add(data)
        b.blob_store.add(data)
        downloader.add_peer_addresses([a.address, b.address, liar.address])
        fetched, _ = await downloader.blobs.fetch(digest, len(data), [a.node_id, b.node_id])
        assert fetched == data and downloader.blobs.stats.retries == 0
        served = {d.peer: d.bytes_sent for d in downloader.diagnostics()}
        assert set(served) == {a.node_id, b.node_id}  # both providers carried ranges
        fetched, _ = await downloader.blobs.fetch(digest, len(data), [liar.node_id, a.node_id])
        assert fetched == data and downloader.blobs.stats.retries >= 1


async def test_rate_limiter_caps_throughput() -> None:
    limiter = RateLimiter(10e6, burst_bytes=100_000)
    started = time.monotonic()
    for _ in range(10):
        await limiter.consume(200_000)
    assert time.monotonic() - started >= (2e6 - 100_000) / 10e6 * 0.95


async def test_bounded_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    in_flight = peak = 0
    data = os.urandom(1000)

    def respond(digest: bytes, offset: int) -> bytes:
        return header(len(data)) + data[offset:]

    config = DownloadConfig(max_concurrent_downloads=2)
    async with (
        fake_provider(respond) as provider,
        started_nodes(1, download_config=config) as (node,),
    ):
        node.add_peer_addresses([provider.address])
        original = node.blobs.fetch

        async def counting_fetch(
            digest: bytes, size: int, providers: Sequence[bytes],
            rate_limiter: RateLimiter | None = None,
        ) -> tuple[bytes, bytes | None]:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                await asyncio.sleep(0.05)
                return await original(digest, size, providers, rate_limiter)
            finally:
                in_flight -= 1

        monkeypatch.setattr(node.blobs, "fetch", counting_fetch)
        results = await asyncio.gather(
            *(node.blobs.download(blob_hash(data), len(data), [provider.node_id]) for _ in range(6))
        )
        assert results == [data] * 6 and peak == 2


async def test_node_lifecycle_and_unreachable_peer() -> None:
    async with P2PNode(config=NodeConfig.loopback(), download_config=FAST_DOWNLOADS) as node:
        assert node.address.direct_addresses[0].startswith("127.0.0.1:")
        with pytest.raises(BlobDownloadError, match="no provider"):
            await node.blobs.download(bytes(32), 10, [node.node_id])
