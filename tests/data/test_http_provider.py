"""HttpDataProvider against a real HTTP server on 127.0.0.1 with Range support."""

import numpy as np
import pytest
import torch
from range_http_server import serve_directory

from client_image.data import DataProviderError, HttpDataProvider, LocalDataProvider, open_provider
from coordinator.config import (
    DontShuffle,
    HttpDataLocation,
    LocalDataLocation,
    NumberedFiles,
    SeededShuffle,
    SingleUrl,
    TokenSize,
    UrlList,
)


def _location(where, shuffle=None):
    return HttpDataLocation(
        location=where, token_size_in_bytes=TokenSize.TwoBytes, shuffle=shuffle or DontShuffle()
    )


def _write(path, tokens):
    np.asarray(tokens, dtype="<u2").tofile(path)


async def _open(location, **kw):
    return await HttpDataProvider.open(location, 4, backoff_s=0.01, **kw)


async def test_single_url_samples_reserve_one_token(tmp_path):
    _write(tmp_path / "a.ds", range(13))  # local would give 3 samples; HTTP reserves a token
    with serve_directory(tmp_path) as server:
        provider = await _open(_location(SingleUrl(url=f"{server.url}/a.ds")))
        try:
            assert provider.num_sequences == 2
            assert (await provider.fetch(0, 1)).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
        finally:
            await provider.aclose()
        # One HEAD for the size, then one range for the two adjacent samples.
        assert server.requests == [("HEAD", "/a.ds", None), ("GET", "/a.ds", "bytes=0-15")]


async def test_numbered_files_and_url_list_concatenate_in_order(tmp_path):
    _write(tmp_path / "shard-007.ds", range(10))
    _write(tmp_path / "shard-008.ds", range(100, 110))
    with serve_directory(tmp_path) as server:
        template = NumberedFiles(
            url_template=f"{server.url}/shard-{{}}.ds", start_index=7, n_left_pad_zeros=3, num_files=2
        )
        listed = UrlList(urls=[f"{server.url}/shard-007.ds", f"{server.url}/shard-008.ds"])
        for where in (template, listed):
            provider = await _open(_location(where))
            try:
                assert (await provider.fetch(0, 3)).tolist() == [
                    [0, 1, 2, 3], [4, 5, 6, 7], [100, 101, 102, 103], [104, 105, 106, 107],
                ]
            finally:
                await provider.aclose()


async def test_seeded_shuffle_matches_the_local_provider(tmp_path):
    _write(tmp_path / "a.ds", range(4 * 50 + 2))
    seed = SeededShuffle(seed=bytes(range(32)))
    local = LocalDataProvider(tmp_path, 4, shuffle=seed)  # 202 tokens: 50 samples either way
    with serve_directory(tmp_path) as server:
        provider = await _open(_location(SingleUrl(url=f"{server.url}/a.ds"), seed))
        try:
            assert provider.num_sequences == local.num_sequences == 50
            assert torch.equal(await provider.fetch(5, 20), local.get_samples(5, 20))
        finally:
            await provider.aclose()


async def test_server_errors_are_retried_with_backoff(tmp_path):
    _write(tmp_path / "a.ds", range(13))
    with serve_directory(tmp_path) as server:
        server.failures["/a.ds"] = 2
        provider = await _open(_location(SingleUrl(url=f"{server.url}/a.ds")), retries=3)
        try:
            server.failures["/a.ds"] = 1
            assert (await provider.fetch(1, 1)).tolist() == [[4, 5, 6, 7]]
            server.failures["/a.ds"] = 10
            with pytest.raises(DataProviderError, match="failed after 4 attempts: HTTP 503"):
                await provider.fetch(0, 0)
        finally:
            await provider.aclose()


async def test_missing_file_short_read_and_bad_index_are_clear_errors(tmp_path):
    _write(tmp_path / "a.ds", range(13))
    _write(tmp_path / "tiny.ds", range(4))
    with serve_directory(tmp_path) as server:
        with pytest.raises(DataProviderError, match="HTTP 404"):
            await _open(_location(SingleUrl(url=f"{server.url}/missing.ds")))
        with pytest.raises(DataProviderError, match="short file"):
            await _open(_location(SingleUrl(url=f"{server.url}/tiny.ds")))
        provider = await _open(_location(SingleUrl(url=f"{server.url}/a.ds")))
        try:
            with pytest.raises(DataProviderError, match="out of range"):
                await provider.fetch(1, 2)
            server.short["/a.ds"] = True
            with pytest.raises(DataProviderError, match="short read"):
                await provider.fetch(0, 0)
        finally:
            await provider.aclose()


async def test_unreachable_server_is_reported_after_retries():
    location = _location(SingleUrl(url="http://127.0.0.1:9/a.ds"))  # discard port: refused
    with pytest.raises(DataProviderError, match="failed after 2 attempts"):
        await HttpDataProvider.open(location, 4, retries=1, backoff_s=0.01)


async def test_open_provider_dispatches_on_the_location(tmp_path):
    _write(tmp_path / "a.ds", range(13))
    local = await open_provider(LocalDataLocation(path=str(tmp_path)), 4)
    assert local.num_sequences == 3
    with serve_directory(tmp_path) as server:
        remote = await open_provider(_location(SingleUrl(url=f"{server.url}/a.ds")), 4, backoff_s=0.01)
        assert remote.num_sequences == 2
        assert isinstance(remote, HttpDataProvider)
        await remote.aclose()
