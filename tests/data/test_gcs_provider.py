"""The Http location `Gcp{bucket_name, filter_directory}` against a real GCS-API server
(gcp-storage-emulator on 127.0.0.1, tests/gcs_emulator.py): the bucket's token files under
the filter, in Psyche's order, read by byte ranges, give the samples the local provider
gives for the same files; a missing bucket or an empty listing is one clear line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gcs_emulator import gcs_emulator
from google.cloud import storage
from range_http_server import serve_directory

from client_image.data import DataProviderError, HttpDataProvider, LocalDataProvider, open_provider
from coordinator.config import (
    DontShuffle,
    GcpBucket,
    HttpDataLocation,
    SeededShuffle,
    TokenSize,
    WeightedHttpDataLocation,
)

SEQ = 8


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[storage.Client]:
    with gcs_emulator(monkeypatch) as client:
        yield client


def gcp(bucket: str, directory: str = "", shuffle: DontShuffle | SeededShuffle | None = None,
        token_size: TokenSize = TokenSize.TwoBytes) -> HttpDataLocation:
    return HttpDataLocation(location=GcpBucket(bucket_name=bucket, filter_directory=directory),
                            token_size_in_bytes=token_size, shuffle=shuffle or DontShuffle())


def token_files(directory: Path, dtype: str = "<u2") -> dict[str, bytes]:
    """Three token files of different lengths, each k samples plus 3 tokens (so that the
    local provider and the HTTP rule, which reserves one token, give the same samples)."""
    directory.mkdir()
    rng = np.random.default_rng(7)
    files = {}
    for name, samples in (("c.npy", 2), ("a.ds", 5), ("b.bin", 3)):
        data = rng.integers(0, 60_000, samples * SEQ + 3).astype(dtype).tobytes()
        (directory / name).write_bytes(data)
        files[name] = data
    return files


def upload(bucket: storage.Bucket, files: dict[str, bytes], prefix: str) -> None:
    for name, data in files.items():
        bucket.blob(f"{prefix}{name}").upload_from_string(data)


@pytest.mark.parametrize("shuffle", [DontShuffle(), SeededShuffle(seed=bytes(range(32)))])
async def test_bucket_samples_equal_the_local_providers(
        gcs: storage.Client, tmp_path: Path, shuffle: DontShuffle | SeededShuffle) -> None:
    files = token_files(tmp_path / "train")
    bucket = gcs.create_bucket("tokens")
    upload(bucket, files, "train/")
    # Outside the filter, or not token files: not part of the location.
    upload(bucket, {"zz.bin": files["a.ds"]}, "validation/")
    upload(bucket, {"README.txt": b"not tokens", "index.json": b"{}"}, "train/")
    local = LocalDataProvider(tmp_path / "train", SEQ, TokenSize.TwoBytes, shuffle)
    provider = await HttpDataProvider.open(gcp("tokens", "train/", shuffle), SEQ)
    try:
        assert provider.urls == [f"gs://tokens/train/{name}" for name in
                                 ("a.ds", "b.bin", "c.npy")]
        assert provider.sizes == [len(files[name]) for name in ("a.ds", "b.bin", "c.npy")]
        assert provider.num_sequences == local.num_sequences == 10
        for start, end in ((0, 0), (0, 9), (3, 6), (9, 9)):
            assert (await provider.fetch(start, end)).equal(local.get_samples(start, end))
    finally:
        await provider.aclose()


async def test_four_byte_tokens_and_no_filter_read_the_whole_bucket(
        gcs: storage.Client, tmp_path: Path) -> None:
    files = token_files(tmp_path / "data", dtype="<u4")
    upload(gcs.create_bucket("wide"), files, "")
    local = LocalDataProvider(tmp_path / "data", SEQ, TokenSize.FourBytes)
    provider = await open_provider(gcp("wide", token_size=TokenSize.FourBytes), SEQ)
    assert provider.num_sequences == local.num_sequences
    assert (await provider.fetch(0, local.num_sequences - 1)).equal(
        local.get_samples(0, local.num_sequences - 1))


async def test_a_weighted_blend_reads_a_gcp_location(gcs: storage.Client, tmp_path: Path) -> None:
    files = token_files(tmp_path / "train")
    upload(gcs.create_bucket("tokens"), files, "train/")
    gcp_only = {"location": {"Gcp": {"bucket_name": "tokens", "filter_directory": "train/"}},
                "token_size_in_bytes": "TwoBytes", "shuffle": "DontShuffle"}
    (tmp_path / "mix.json").write_text(json.dumps(
        {"shuffle": "DontShuffle", "providers": [[gcp_only, 1.0]]}))
    local = LocalDataProvider(tmp_path / "train", SEQ)
    with serve_directory(tmp_path) as server:
        provider = await open_provider(WeightedHttpDataLocation(url=f"{server.url}/mix.json"), SEQ)
    assert (await provider.fetch(0, 9)).equal(local.get_samples(0, 9))


async def test_a_missing_bucket_or_empty_listing_is_one_clear_line(
        gcs: storage.Client, tmp_path: Path) -> None:
    with pytest.raises(DataProviderError) as missing:
        await open_provider(gcp("absent"), SEQ)
    assert str(missing.value) == "GCP bucket 'absent': not found"
    bucket = gcs.create_bucket("notes")
    upload(bucket, {"a.txt": b"words"}, "train/")
    upload(bucket, token_files(tmp_path / "other"), "elsewhere/")
    with pytest.raises(DataProviderError) as empty:
        await open_provider(gcp("notes", "train/"), SEQ)
    assert str(empty.value) == ("GCP bucket 'notes' has no token files (.ds, .bin, .npy) "
                                "under 'train/'")


async def test_truncated_or_vanished_objects_are_clear_errors(
        gcs: storage.Client, tmp_path: Path) -> None:
    bucket = gcs.create_bucket("broken")
    upload(bucket, {"odd.bin": bytes(2 * SEQ * 2 + 1)}, "")
    with pytest.raises(DataProviderError, match=r"gs://broken/odd.bin: 33 bytes is not a whole"):
        await open_provider(gcp("broken"), SEQ)
    bucket.blob("odd.bin").delete()
    upload(bucket, {"short.bin": bytes(SEQ * 2)}, "")
    with pytest.raises(DataProviderError, match=r"gs://broken/short.bin: short file"):
        await open_provider(gcp("broken"), SEQ)
    bucket.blob("short.bin").delete()
    upload(bucket, token_files(tmp_path / "ok"), "")
    provider = await open_provider(gcp("broken"), SEQ)
    bucket.blob("a.ds").delete()
    with pytest.raises(DataProviderError) as gone:
        await provider.fetch(0, 0)
    assert str(gone.value) == "gs://broken/a.ds: 16 bytes at offset 0: not found"
