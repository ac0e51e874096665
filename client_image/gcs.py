"""The Google Cloud Storage client of the GCP data location and of Gcs checkpoints
(docs/data-and-checkpoints.md).

    storage_client() -> google.cloud.storage.Client
    gcs_problem(exc, what) -> str       a one-line description of a GCS failure

Anonymous (public buckets, as Psyche reads them) unless GOOGLE_APPLICATION_CREDENTIALS
names a credentials file, then with those credentials (needed to upload). The
STORAGE_EMULATOR_HOST environment variable, which google-cloud-storage honours itself,
points either at a GCS-API emulator (the tests start one on loopback).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.cloud.storage import Client


def storage_client() -> Client:
    """A GCS client: with GOOGLE_APPLICATION_CREDENTIALS' credentials if set, else anonymous."""
    from google.cloud import storage

    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return storage.Client()
    return storage.Client.create_anonymous_client()


def gcs_problem(exc: BaseException, what: str) -> str:
    """`what: <the failure>` on one line, for GCS API errors (their message carries the
    whole HTTP response) and transport errors alike."""
    from google.api_core import exceptions

    if isinstance(exc, exceptions.NotFound):
        return f"{what}: not found"
    if isinstance(exc, exceptions.Forbidden | exceptions.Unauthorized):
        return (f"{what}: access denied (set GOOGLE_APPLICATION_CREDENTIALS to a credentials "
                "file that may read it)")
    message = " ".join(str(exc).split())
    return f"{what}: {type(exc).__name__}: {message[:300]}"
