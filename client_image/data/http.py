"""HTTP data provider: token files on a web server, read with byte-range requests.

File sizes come from HEAD's Content-Length when the provider opens; a fetch groups the
requested samples into runs that are adjacent in one file and asks for each run with one
`Range: bytes=a-b` request (5 s timeout), up to RANGE_READS_IN_FLIGHT of them at once (a
shuffled batch is one request per sample; asking them one after the other made a batch
of 256 samples cost 256 round trips). Transport errors and 5xx answers are retried
with exponential backoff (backoff_s * 2^attempt); a 4xx answer (a missing file) fails at
once. A response shorter than asked is an error, never a silently short batch.

A `Gcp` location lists its bucket instead (client_image/data/gcs.py `open_gcp`: sizes from
the listing, ranges read through google-cloud-storage); both read through a `RangeReader`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

import httpx
import torch

from coordinator.config import GcpBucket, HttpDataLocation, NumberedFiles, SingleUrl, UrlList
from psyche_common.token_files.sequences import (
    DataProviderError,
    adjacent_runs,
    build_sequence_index,
    check_batch,
    tokens_to_tensor,
)

logger = logging.getLogger(__name__)
RANGE_READS_IN_FLIGHT = 16  # per fetch: well under httpx's pool of 100 connections


def location_urls(location: HttpDataLocation) -> list[str]:
    """The file URLs of an HTTP data location, in order."""
    where = location.location
    if isinstance(where, SingleUrl):
        return [where.url]
    if isinstance(where, UrlList):
        return list(where.urls)
    if isinstance(where, NumberedFiles):
        return [
            where.url_template.replace("{}", str(where.start_index + i).zfill(where.n_left_pad_zeros))
            for i in range(where.num_files)
        ]
    raise DataProviderError(f"HTTP location {type(where).__name__} has no fixed URLs: "
                            "its files are listed when the provider opens")


class RangeReader(Protocol):
    """Reads `length` bytes at `offset` of one file of the provider (all or an error)."""

    async def read_range(self, url: str, offset: int, length: int) -> bytes: ...

    async def aclose(self) -> None: ...


class _RetryingClient:
    """httpx with retries: transport errors and 5xx are retried with backoff, 4xx are not."""

    def __init__(self, client: httpx.AsyncClient, retries: int, backoff_s: float, owned: bool) -> None:
        self.client = client
        self.retries = retries
        self.backoff_s = backoff_s
        self.owned = owned

    async def request(self, method: str, url: str, headers: dict[str, str]) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                response = await self.client.request(method, url, headers=headers)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 400:
                    return response
                if response.status_code < 500:
                    raise DataProviderError(
                        f"{method} {url}: HTTP {response.status_code} (missing file?)"
                    )
                problem = f"HTTP {response.status_code}"
            if attempt == self.retries:
                raise DataProviderError(
                    f"{method} {url} failed after {attempt + 1} attempts: {problem}"
                )
            delay = self.backoff_s * 2**attempt
            logger.warning("%s %s: %s; retrying in %.2fs", method, url, problem, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def read_range(self, url: str, offset: int, length: int) -> bytes:
        headers = {"Range": f"bytes={offset}-{offset + length - 1}"}
        response = await self.request("GET", url, headers)
        body = response.content
        if response.status_code == 200:  # server ignored Range: take our slice of the file
            body = body[offset : offset + length]
        return check_length(url, offset, length, body)

    async def aclose(self) -> None:
        if self.owned:
            await self.client.aclose()


def check_length(url: str, offset: int, length: int, body: bytes) -> bytes:
    if len(body) != length:
        raise DataProviderError(
            f"{url}: short read, asked {length} bytes at offset {offset}, got {len(body)}"
        )
    return body


class HttpDataProvider:
    """Samples of token files served over HTTP. Create with `await HttpDataProvider.open(...)`."""

    def __init__(
        self,
        urls: Sequence[str],
        sizes: Sequence[int],
        location: HttpDataLocation,
        max_seq_len: int,
        reader: RangeReader,
    ) -> None:
        self.urls = list(urls)
        self.sizes = list(sizes)
        self.token_size = location.token_size_in_bytes
        self.max_seq_len = max_seq_len
        self._sample_bytes = max_seq_len * self.token_size.nbytes
        self._index = build_sequence_index(
            self.sizes, self._sample_bytes, self.token_size.nbytes, location.shuffle
        )
        self._reader = reader

    @classmethod
    async def open(
        cls,
        location: HttpDataLocation,
        max_seq_len: int,
        *,
        client: httpx.AsyncClient | None = None,
        retries: int = 3,
        backoff_s: float = 1.0,
        timeout_s: float = 5.0,
    ) -> HttpDataProvider:
        """HEAD every file for its size (a Gcp location: list the bucket) and build the
        sequence index."""
        if max_seq_len < 1:
            raise DataProviderError(f"max_seq_len must be >= 1, got {max_seq_len}")
        if isinstance(location.location, GcpBucket):
            from client_image.data.gcs import open_gcp

            return await open_gcp(location, max_seq_len, timeout_s=timeout_s)
        http = _RetryingClient(
            client or httpx.AsyncClient(timeout=timeout_s), retries, backoff_s, client is None
        )
        try:
            urls = location_urls(location)
            token_bytes = location.token_size_in_bytes.nbytes
            sizes = [
                await _content_length(http, url, token_bytes, max_seq_len * token_bytes)
                for url in urls
            ]
            return cls(urls, sizes, location, max_seq_len, http)
        except BaseException:
            await http.aclose()
            raise

    async def aclose(self) -> None:
        """Close the HTTP client if the provider created it."""
        await self._reader.aclose()

    @property
    def num_sequences(self) -> int:
        return len(self._index)

    async def fetch(self, start: int, end: int) -> torch.Tensor:
        """Samples start..end (inclusive) as an int64 tensor [end - start + 1, max_seq_len]."""
        check_batch(start, end, self.num_sequences)
        runs = adjacent_runs(*self._index.batch(start, end), self._sample_bytes)
        slots = asyncio.Semaphore(RANGE_READS_IN_FLIGHT)

        async def read(file_index: int, offset: int, count: int) -> bytes:
            async with slots:
                return await self._reader.read_range(
                    self.urls[file_index], offset, count * self._sample_bytes)

        # The first failure cancels the other reads (none outlives the fetch) and is raised
        # as itself: callers expect one DataProviderError, not an ExceptionGroup.
        try:
            async with asyncio.TaskGroup() as group:
                reads = [group.create_task(read(*run)) for run in runs]
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        parts = [read.result() for read in reads]
        return tokens_to_tensor(b"".join(parts), self.token_size, self.max_seq_len)


async def _content_length(http: _RetryingClient, url: str, token_bytes: int, sample_bytes: int) -> int:
    response = await http.request("HEAD", url, {})
    size = response.headers.get("content-length")
    if size is None or not size.isdigit():
        raise DataProviderError(f"{url}: HEAD gave no Content-Length")
    return check_file_size(url, int(size), token_bytes, sample_bytes)


def check_file_size(url: str, size: int, token_bytes: int, sample_bytes: int) -> int:
    """`size`, unless the file cannot be a token file of at least one sample."""
    if size % token_bytes:
        raise DataProviderError(f"{url}: {size} bytes is not a whole number of tokens")
    if size <= sample_bytes + token_bytes:
        raise DataProviderError(f"{url}: short file, {size} bytes cannot hold one sample")
    return size
