"""Blob transfer on ALPN ``psyche/blobs/0``: serve the store, fetch verified blobs.

Request (one bi-stream per request)::

    hash (32) ‖ offset (u64 BE) ‖ length (u64 BE, 0 = to the end) [‖ flags (u8)]

The flags byte is optional (older askers send none, and older servers ignore
it); bit 0, ``FLAG_MAY_REDIRECT``, says the asker accepts being sent to another
holder. Response: ``status (u8: 0 ok, 1 not found, 2 bad request, 3 redirect,
4 busy) ‖ u64 BE`` then, for ok, the blob size and ``length`` raw bytes; for
redirect, a holder count and that many 32-byte node ids (see ``holders.py``
for when a server redirects); then the stream is finished.

Serving may be capped (``upload_bytes_per_second``, the client's ``--max-upload-mbps``):
one token bucket for everything this node serves (model parameters to joiners, round
results to peers), written in ``CAPPED_SERVE_CHUNK`` pieces so the rate holds within a
transfer and not only across them.

A download hashes the bytes as they arrive (BLAKE3), never accepts more than
the announced size, and on a failed or stalled provider resumes at the same
offset from the next one after a jittered, growing pause. A hash mismatch at
the end discards everything and blames the providers that contributed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

import iroh

from client_image.p2p import framing
from client_image.p2p.blob_segments import Segment, digest_of, split
from client_image.p2p.blob_store import HASH_BYTES, BlobStore
from client_image.p2p.holders import HolderBook
from client_image.p2p.transport import Transport, TransportError

logger = logging.getLogger(__name__)

BLOBS_ALPN = b"psyche/blobs/0"
REQUEST = struct.Struct(">32sQQ")
RESPONSE_HEADER = struct.Struct(">BQ")
STATUS_OK, STATUS_NOT_FOUND, STATUS_BAD_REQUEST, STATUS_REDIRECT, STATUS_BUSY = 0, 1, 2, 3, 4
FLAG_MAY_REDIRECT = 0x01
MAX_REDIRECT_HOLDERS = 16
MAX_REQUEST_EXTRA = 16  # bytes after the fixed request that a server reads (flags and future)
SERVE_CHUNK = 1 << 20
CAPPED_SERVE_CHUNK = 64 << 10  # under an upload cap: small writes, a smooth rate


class BlobDownloadError(RuntimeError):
    """A blob could not be fetched and verified from any provider."""


class BlobProtocolError(ConnectionError):
    """A provider answered something other than the blob we asked for."""


class BlobRedirect(BlobProtocolError):
    """The provider has the blob but points the asker to these other holders."""

    def __init__(self, holders: list[bytes]) -> None:
        super().__init__(f"redirected to {len(holders)} holders")
        self.holders = holders


class BlobBusy(BlobProtocolError):
    """The provider has the blob but is uploading it to enough peers already."""


class BlobNotFound(BlobProtocolError):
    """The provider does not have the blob (a holder we were sent to may get it soon)."""


# What one provider can do wrong; the download moves on to the next provider.
PROVIDER_FAILURES = (
    TimeoutError, TransportError, BlobProtocolError, framing.StreamClosed, iroh.IrohError
)


class BlobFetchFailed(RuntimeError):
    """One try from one provider failed (unreachable, protocol error, wrong bytes)."""

    def __init__(self, message: str, *, wrong_bytes: bool = False) -> None:
        super().__init__(message)
        self.wrong_bytes = wrong_bytes


@dataclass(frozen=True)
class DownloadConfig:
    max_blob_bytes: int = 2 << 30
    max_concurrent_downloads: int = 4
    max_attempts: int = 6
    read_timeout_s: float = 10.0
    total_timeout_s: float = 600.0
    backoff_base_s: float = 0.25
    backoff_max_s: float = 8.0
    read_chunk_bytes: int = 1 << 20
    # Workaround for the binding's per-stream ceiling: split big blobs into ranges fetched
    # on parallel streams (and from different providers when several announced it).
    parallel_streams: int = 1
    parallel_min_bytes: int = 16 << 20


@dataclass
class DownloadStats:
    started: int = 0
    finished: int = 0
    retries: int = 0
    failed: int = 0
    bytes_received: int = 0


class RateLimiter:
    """Token bucket: ``consume(n)`` waits so the long-run rate stays ≤ bytes_per_second."""

    def __init__(self, bytes_per_second: float, burst_bytes: int = 1 << 20) -> None:
        if bytes_per_second <= 0:
            raise ValueError("bandwidth cap must be positive")
        self.rate = bytes_per_second
        self.burst = float(burst_bytes)
        self._tokens = self.burst
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def consume(self, amount: int) -> None:
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= amount
            if self._tokens < 0:
                await asyncio.sleep(-self._tokens / self.rate)


def backoff_delay(attempt: int, config: DownloadConfig) -> float:
    """delay = min(max, base·2^attempt) · U(0.5, 1): exponential with jitter, never zero."""
    return min(config.backoff_max_s, config.backoff_base_s * 2**attempt) * random.uniform(0.5, 1.0)


class BlobService:
    """Serves ``store`` to peers and downloads blobs from them."""

    def __init__(
        self,
        transport: Transport,
        store: BlobStore,
        config: DownloadConfig | None = None,
        upload_bytes_per_second: float | None = None,
    ) -> None:
        self.transport = transport
        self.store = store
        self.config = config or DownloadConfig()
        # One bucket for every blob served, whoever asks: the cap is the node's upload.
        self.upload_limiter = (None if upload_bytes_per_second is None
                               else RateLimiter(upload_bytes_per_second))
        self.bytes_served = 0
        self.stats = DownloadStats()
        self.holders = HolderBook()
        self.slots = asyncio.Semaphore(self.config.max_concurrent_downloads)
        transport.register_protocol(BLOBS_ALPN, self._handle_connection)

    # -- serving -------------------------------------------------------------------------
    async def _handle_connection(self, connection: iroh.Connection) -> None:
        requests: set[asyncio.Task[None]] = set()
        try:
            requester = connection.remote_id().to_bytes()
            while True:
                stream = await connection.accept_bi()
                task = asyncio.create_task(self._serve(stream.send(), stream.recv(), requester))
                requests.add(task)
                task.add_done_callback(requests.discard)
        except iroh.IrohError:
            pass
        finally:
            for task in requests:
                task.cancel()

    async def _serve(self, send: iroh.SendStream, recv: iroh.RecvStream, requester: bytes) -> None:
        try:
            raw = await asyncio.wait_for(framing.read_exact(recv, REQUEST.size), 10)
            digest, offset, length = REQUEST.unpack(raw)
            extra = await asyncio.wait_for(recv.read(MAX_REQUEST_EXTRA), 10)
            may_redirect = bool(extra) and bool(extra[0] & FLAG_MAY_REDIRECT)
            data = self.store.get(digest)
            decision = self.holders.decide(digest, requester) if may_redirect and data else "serve"
            if data is None:
                await send.write_all(RESPONSE_HEADER.pack(STATUS_NOT_FOUND, 0))
            elif offset > len(data):
                await send.write_all(RESPONSE_HEADER.pack(STATUS_BAD_REQUEST, len(data)))
            elif decision == "busy":
                await send.write_all(RESPONSE_HEADER.pack(STATUS_BUSY, 0))
            elif isinstance(decision, list):
                ids = decision[:MAX_REDIRECT_HOLDERS]
                await send.write_all(RESPONSE_HEADER.pack(STATUS_REDIRECT, len(ids)) + b"".join(ids))
            else:
                end = len(data) if length == 0 else min(len(data), offset + length)
                limiter = self.upload_limiter
                chunk = SERVE_CHUNK if limiter is None else CAPPED_SERVE_CHUNK
                with self.holders.uploading(digest):
                    await send.write_all(RESPONSE_HEADER.pack(STATUS_OK, len(data)))
                    for start in range(offset, end, chunk):
                        piece = data[start : min(end, start + chunk)]
                        if limiter is not None:
                            await limiter.consume(len(piece))
                        await send.write_all(piece)
                        self.bytes_served += len(piece)
                    await send.finish()
                self.holders.served(digest, requester, end - offset, now_holds=may_redirect)
                return
            await send.finish()
        except (TimeoutError, framing.StreamClosed, iroh.IrohError) as error:
            logger.debug("blob request failed: %s", error)
            with contextlib.suppress(Exception):
                await send.finish()  # never leave the requester waiting

    # -- downloading ----------------------------------------------------------------------
    async def download(
        self,
        digest: bytes,
        size: int,
        providers: Sequence[bytes],
        rate_limiter: RateLimiter | None = None,
        *,
        in_order: bool = False,
    ) -> bytes:
        """Fetch the blob ``digest`` of ``size`` bytes from any of ``providers``, verified;
        tried in a random order, or in the given one with ``in_order``.

        Raises ``BlobDownloadError`` naming the cause once every attempt is spent.
        """
        candidates = list(providers)
        if not in_order:
            random.shuffle(candidates)
        async with self.slots:
            data, _ = await self.fetch(digest, size, candidates, rate_limiter)
        return data

    async def fetch(
        self,
        digest: bytes,
        size: int,
        providers: Sequence[bytes],
        rate_limiter: RateLimiter | None = None,
    ) -> tuple[bytes, bytes | None]:
        """Like ``download`` but tries ``providers`` in the given order and takes no slot.

        Returns the data and the provider that completed it (None: it was local).
        """
        self.check_request(digest, size)
        local = self.store.get(digest)
        if local is not None:
            return local, None
        candidates = list(dict.fromkeys(p for p in providers if p != self.transport.node_id))
        if not candidates:
            raise BlobDownloadError(f"no provider for blob {digest.hex()[:12]}")
        self.stats.started += 1
        try:
            result = await asyncio.wait_for(
                self._download(digest, size, candidates, rate_limiter), self.config.total_timeout_s
            )
        except TimeoutError:
            self.stats.failed += 1
            raise BlobDownloadError(
                f"blob {digest.hex()[:12]} not complete after {self.config.total_timeout_s}s"
            ) from None
        except BlobDownloadError:
            self.stats.failed += 1
            raise
        self.stats.finished += 1
        return result

    def check_request(self, digest: bytes, size: int) -> None:
        if len(digest) != HASH_BYTES:
            raise BlobDownloadError(f"blob hash must be {HASH_BYTES} bytes, got {len(digest)}")
        if not 0 <= size <= self.config.max_blob_bytes:
            raise BlobDownloadError(
                f"blob size {size} exceeds the limit of {self.config.max_blob_bytes} bytes"
            )

    async def _download(
        self, digest: bytes, size: int, providers: list[bytes], limiter: RateLimiter | None
    ) -> tuple[bytes, bytes]:
        """Attempt loop: every unfinished segment resumes where it stopped, segment i
        from provider (attempt + i) mod n, after a jittered backoff when one failed."""
        segments = split(size, self._segment_count(size))
        errors: list[str] = []
        for attempt in range(self.config.max_attempts):
            failures = await asyncio.gather(
                *(
                    self._fill_segment(
                        providers[(attempt + i) % len(providers)], digest, size, seg, limiter
                    )
                    for i, seg in enumerate(segments)
                )
            )
            errors.extend(f for f in failures if f)
            if not any(failures):
                if digest_of(segments) == digest:
                    return b"".join(seg.data for seg in segments), providers[
                        attempt % len(providers)
                    ]
                errors.append(
                    f"{providers[attempt % len(providers)].hex()[:8]}: content does not match the hash"
                )
                # cannot tell which provider lied: start over on one stream, one provider per attempt
                segments = split(size, 1)
            self.stats.retries += 1
            if attempt + 1 < self.config.max_attempts:
                await asyncio.sleep(backoff_delay(attempt, self.config))
        raise BlobDownloadError(
            f"blob {digest.hex()[:12]} ({size} bytes) failed after {self.config.max_attempts} attempts: "
            + "; ".join(list(dict.fromkeys(errors))[:4])  # distinct, the first (the cause) first
        )

    async def fetch_once(
        self, provider: bytes, digest: bytes, size: int, *, may_redirect: bool = True
    ) -> bytes:
        """One try of the whole blob from ``provider``, verified by its hash.

        Raises ``BlobRedirect`` / ``BlobBusy`` (only with ``may_redirect``), ``BlobNotFound``,
        or ``BlobFetchFailed`` naming the provider and the cause (wrong bytes included).
        """
        segment = split(size, 1)[0]
        flags = FLAG_MAY_REDIRECT if may_redirect else 0
        try:
            await self._fetch_range(provider, digest, size, segment, None, flags)
        except (BlobRedirect, BlobBusy, BlobNotFound):
            raise  # answers, not failures: the connection stays
        except PROVIDER_FAILURES as error:
            self.transport.drop_connection(provider, BLOBS_ALPN)
            raise BlobFetchFailed(f"{provider.hex()[:8]}: {type(error).__name__}: {error}") from None
        if digest_of([segment]) != digest:
            raise BlobFetchFailed(
                f"{provider.hex()[:8]}: content does not match the hash", wrong_bytes=True
            )
        return bytes(segment.data)

    def _segment_count(self, size: int) -> int:
        if self.config.parallel_streams <= 1 or size < self.config.parallel_min_bytes:
            return 1
        return self.config.parallel_streams

    async def _fill_segment(
        self,
        provider: bytes,
        digest: bytes,
        size: int,
        segment: Segment,
        limiter: RateLimiter | None,
    ) -> str | None:
        """Fetch the rest of ``segment`` from ``provider``; returns an error line or None."""
        if segment.complete:
            return None
        try:
            await self._fetch_range(provider, digest, size, segment, limiter)
            return None
        except PROVIDER_FAILURES as error:
            self.transport.drop_connection(provider, BLOBS_ALPN)
            return f"{provider.hex()[:8]}: {type(error).__name__}: {error}"

    async def _fetch_range(
        self,
        provider: bytes,
        digest: bytes,
        size: int,
        segment: Segment,
        limiter: RateLimiter | None,
        flags: int = 0,
    ) -> None:
        """Append the missing bytes of ``segment`` from ``provider``, hashing as they arrive."""
        timeout = self.config.read_timeout_s
        connection = await self.transport.connect(provider, BLOBS_ALPN)
        stream = await asyncio.wait_for(connection.open_bi(), timeout)
        send, recv = stream.send(), stream.recv()
        try:
            request = REQUEST.pack(digest, segment.next_offset, segment.missing or 0)
            await send.write_all(request + bytes([flags]) if flags else request)
            await send.finish()
            header = await asyncio.wait_for(framing.read_exact(recv, RESPONSE_HEADER.size), timeout)
            status, total = RESPONSE_HEADER.unpack(header)
            if status == STATUS_NOT_FOUND:
                raise BlobNotFound("provider does not have the blob")
            if flags & FLAG_MAY_REDIRECT and status == STATUS_BUSY:
                raise BlobBusy("provider is busy uploading this blob")
            if flags & FLAG_MAY_REDIRECT and status == STATUS_REDIRECT:
                if not 0 < total <= MAX_REDIRECT_HOLDERS:
                    raise BlobProtocolError(f"provider redirected to {total} holders")
                ids = await asyncio.wait_for(framing.read_exact(recv, 32 * total), timeout)
                raise BlobRedirect([ids[i : i + 32] for i in range(0, len(ids), 32)])
            if status != STATUS_OK:
                raise BlobProtocolError(f"provider answered status {status}")
            if total != size:
                raise BlobProtocolError(f"provider says {total} bytes, announcement says {size}")
            while segment.missing:
                chunk = await asyncio.wait_for(recv.read(self.config.read_chunk_bytes), timeout)
                if not chunk:
                    raise framing.StreamClosed(
                        f"stream ended at {segment.next_offset} of {size} bytes"
                    )
                if len(chunk) > segment.missing:
                    raise BlobProtocolError(f"provider sent more than the announced {size} bytes")
                segment.append(chunk)
                self.stats.bytes_received += len(chunk)
                if limiter is not None:
                    await limiter.consume(len(chunk))
            trailing = await asyncio.wait_for(recv.read(1), timeout)
            if trailing:
                raise BlobProtocolError(f"provider sent more than the announced {size} bytes")
        finally:
            with contextlib.suppress(Exception):
                await recv.stop(0)
