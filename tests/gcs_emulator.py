"""A real GCS-API server for the tests: gcp-storage-emulator on a free loopback port, in
this process, with STORAGE_EMULATOR_HOST pointing google-cloud-storage at it (tests/ is on
sys.path through its conftest.py).

    with gcs_emulator(monkeypatch) as client:   # an anonymous google.cloud.storage.Client
        client.create_bucket("data")
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
from gcp_storage_emulator.server import create_server
from google.cloud import storage
from loopback import free_port


@contextlib.contextmanager
def gcs_emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[storage.Client]:
    port = free_port()
    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        yield storage.Client.create_anonymous_client()
    finally:
        server.stop()
