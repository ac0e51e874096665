"""The `Gcp{bucket_name, filter_directory}` Http location: token files in a GCS bucket.

    await open_gcp(location, max_seq_len, *, timeout_s=5.0, client=None) -> HttpDataProvider
    list_token_objects(client, bucket_name, filter_directory) -> list[GcsObject]

As Psyche's client: the bucket's objects whose names start with `filter_directory` and end
in a token-file extension (.ds, .bin, .npy), sorted by URL (`gs://bucket/name`, the same
order as Psyche's `https://storage.googleapis.com/bucket/name`), are the location's files,
in that order; their sizes come from the listing. Samples are then read by byte ranges like
any Http location's (client_image/data/http.py), here through google-cloud-storage's ranged
download, which retries transient failures itself and reads private buckets with
credentials too (client_image/gcs.py: anonymous unless GOOGLE_APPLICATION_CREDENTIALS;
STORAGE_EMULATOR_HOST points it at an emulator).

A missing bucket, one with no token files under the filter, or an object that is not a
whole number of tokens or holds no sample is a one-line DataProviderError.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from client_image.data.http import HttpDataProvider, check_file_size, check_length
from client_image.gcs import gcs_problem, storage_client
from coordinator.config import GcpBucket, HttpDataLocation
from psyche_common.token_files.sequences import TOKEN_FILE_EXTENSIONS, DataProviderError

if TYPE_CHECKING:
    from google.cloud.storage import Bucket, Client


@dataclass(frozen=True)
class GcsObject:
    name: str
    size: int

    def url(self, bucket_name: str) -> str:
        return f"gs://{bucket_name}/{self.name}"


def list_token_objects(client: Client, bucket_name: str, filter_directory: str) -> list[GcsObject]:
    """The token files of the bucket under `filter_directory`, in Psyche's order (blocking)."""
    where = f"GCP bucket {bucket_name!r}"
    try:
        blobs = list(client.list_blobs(bucket_name, prefix=filter_directory or None))
    except Exception as exc:  # google.api_core errors and transport errors alike
        raise DataProviderError(gcs_problem(exc, where)) from None
    found = [GcsObject(blob.name, int(blob.size or 0)) for blob in blobs
             if blob.name.endswith(TOKEN_FILE_EXTENSIONS)]
    if not found:
        under = f" under {filter_directory!r}" if filter_directory else ""
        raise DataProviderError(
            f"{where} has no token files ({', '.join(TOKEN_FILE_EXTENSIONS)}){under}")
    return sorted(found, key=lambda obj: obj.url(bucket_name))


class GcsRanges:
    """The RangeReader of a bucket's objects (the provider's URLs are `gs://bucket/name`)."""

    def __init__(self, bucket: Bucket, timeout_s: float) -> None:
        self.bucket = bucket
        self.timeout_s = timeout_s
        self._prefix = f"gs://{bucket.name}/"

    async def read_range(self, url: str, offset: int, length: int) -> bytes:
        blob = self.bucket.blob(url.removeprefix(self._prefix))
        try:
            body = await asyncio.to_thread(
                blob.download_as_bytes, start=offset, end=offset + length - 1,
                raw_download=True, timeout=self.timeout_s)
        except Exception as exc:
            raise DataProviderError(
                gcs_problem(exc, f"{url}: {length} bytes at offset {offset}")) from None
        return check_length(url, offset, length, body)

    async def aclose(self) -> None:
        """Nothing to close: google-cloud-storage's session closes with the client."""


async def open_gcp(location: HttpDataLocation, max_seq_len: int, *, timeout_s: float = 5.0,
                   client: Client | None = None) -> HttpDataProvider:
    """List the bucket and build the provider (the blocking listing runs off the loop)."""
    where = location.location
    if not isinstance(where, GcpBucket):
        raise DataProviderError(f"HTTP location {type(where).__name__} is not a GCP bucket")
    gcs = client if client is not None else await asyncio.to_thread(storage_client)
    objects = await asyncio.to_thread(
        list_token_objects, gcs, where.bucket_name, where.filter_directory)
    token_bytes = location.token_size_in_bytes.nbytes
    urls = [obj.url(where.bucket_name) for obj in objects]
    sizes = [check_file_size(url, obj.size, token_bytes, max_seq_len * token_bytes)
             for url, obj in zip(urls, objects, strict=True)]
    reader = GcsRanges(gcs.bucket(where.bucket_name), timeout_s)
    return HttpDataProvider(urls, sizes, location, max_seq_len, reader)


__all__ = ["GcsObject", "GcsRanges", "list_token_objects", "open_gcp"]
