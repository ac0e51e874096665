"""Data providers: the token samples a client trains on
(docs/data-and-checkpoints.md, "Data providers").

Public surface:

    DataProvider                      protocol: num_sequences, async fetch(start, end) -> Tensor
    LocalDataProvider(path, max_seq_len, token_size=TwoBytes, shuffle=None)
        .get_samples(start, end) -> Tensor [n, max_seq_len] int64   (sync)
        await .fetch(start, end)                                    (off the event loop)
    await HttpDataProvider.open(location: HttpDataLocation, max_seq_len, *, client=None,
                                retries=3, backoff_s=1.0, timeout_s=5.0)
        await .fetch(start, end); await .aclose()
    DummyDataProvider(max_seq_len)   Dummy: zeros for every index (Psyche's dummy data)
    PreprocessedDataProvider(dir, max_seq_len)
                                      parquet rows (`inputs`, optional `labels`), by row groups
        await .fetch_labelled(start, end) -> (inputs, labels | None)
    open_preprocessed(source, max_seq_len)   a directory or a HF dataset id (blocking)
    WeightedDataProvider(providers, weights, shuffle)   Psyche's greedy blend
    await open_weighted_http(url, max_seq_len)           WeightedHttp: JSON of Http locations
    await open_provider(location: OpenableLocation, max_seq_len, **kw)
                                      Local, Http, Dummy, Preprocessed, WeightedHttp
    DataProviderError                 missing/short file, index out of range, server failure
    shuffle_in_place(items, seed)     ChaCha8Rng + rand 0.9 slice shuffle (Seeded shuffle)
    await TcpDataProvider.open(address, identity, run_id, max_seq_len)
                                      the coordinator's TCP data server (Server location)
        await .fetch_labelled(start, end) -> (inputs, labels | None)
    await fetch_training_batch(provider, start, end, data_type) -> Tensor
                                      what the trainer gets: Pretraining the inputs
                                      [n, max_seq_len]; Finetuning inputs and labels
                                      [n, 2, max_seq_len] (the provider's labels, else
                                      the inputs; formats.batch.with_labels)

A batch id [start, end] is inclusive; sample i is exactly max_seq_len tokens (see
psyche_common.token_files.sequences for the offset rules).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, TypedDict, Unpack

import torch

from client_image.data.dummy import DummyDataProvider
from client_image.data.http import HttpDataProvider, location_urls
from client_image.data.tcp_provider import DataServerMismatch, TcpDataProvider
from client_image.formats.batch import with_labels
from coordinator.config import (
    DataType,
    DummyDataLocation,
    HttpDataLocation,
    LocalDataLocation,
    PreprocessedDataLocation,
    TokenSize,
    WeightedHttpDataLocation,
)
from psyche_common.token_files.chacha import ChaChaRng, shuffle_in_place
from psyche_common.token_files.local import LocalDataProvider
from psyche_common.token_files.sequences import DataProviderError


class DataProvider(Protocol):
    @property
    def num_sequences(self) -> int: ...

    async def fetch(self, start: int, end: int) -> torch.Tensor: ...


class _Fetches(Protocol):
    async def fetch(self, start: int, end: int) -> torch.Tensor: ...


class LabelledDataProvider(DataProvider, Protocol):
    """A provider whose samples may carry labels (Preprocessed, the TCP data server)."""

    async def fetch_labelled(self, start: int,
                             end: int) -> tuple[torch.Tensor, torch.Tensor | None]: ...


async def fetch_training_batch(provider: _Fetches, start: int, end: int,
                               data_type: DataType) -> torch.Tensor:
    """Samples start..end as the trainer takes them (module docstring). A Pretraining
    run never reads labels: its batches stay exactly the provider's inputs."""
    if data_type != "Finetuning":
        return await provider.fetch(start, end)
    fetch_labelled = getattr(provider, "fetch_labelled", None)
    if fetch_labelled is None:
        inputs, labels = await provider.fetch(start, end), None
    else:
        inputs, labels = await fetch_labelled(start, end)
    return with_labels(inputs, inputs if labels is None else labels)


class _HttpOptions(TypedDict, total=False):
    """The keyword arguments `open_provider` passes on to `HttpDataProvider.open`."""

    retries: int
    backoff_s: float
    timeout_s: float


OpenableLocation = (LocalDataLocation | HttpDataLocation | DummyDataLocation
                    | PreprocessedDataLocation | WeightedHttpDataLocation)
OPENABLE_LOCATIONS = (LocalDataLocation, HttpDataLocation, DummyDataLocation,
                      PreprocessedDataLocation, WeightedHttpDataLocation)


async def open_provider(
    location: OpenableLocation,
    max_seq_len: int,
    *,
    token_size: TokenSize = TokenSize.TwoBytes,
    **http_options: Unpack[_HttpOptions],
) -> DataProvider:
    """A provider for a run config's data location (Local: TwoBytes, unshuffled).

    pyarrow (Preprocessed) is imported only when such a location is opened."""
    if isinstance(location, LocalDataLocation):
        return LocalDataProvider(location.path, max_seq_len, token_size)
    if isinstance(location, HttpDataLocation):
        return await HttpDataProvider.open(location, max_seq_len, **http_options)
    if isinstance(location, DummyDataLocation):
        return DummyDataProvider(max_seq_len)
    if isinstance(location, PreprocessedDataLocation):
        from client_image.data.preprocessed import open_preprocessed

        return await asyncio.to_thread(open_preprocessed, location.source, max_seq_len)
    if isinstance(location, WeightedHttpDataLocation):
        from client_image.data.weighted import open_weighted_http

        return await open_weighted_http(location.url, max_seq_len, **http_options)
    raise DataProviderError(f"data location {type(location).__name__} is not supported here")


__all__ = [
    "OPENABLE_LOCATIONS",
    "ChaChaRng",
    "DataProvider",
    "DataProviderError",
    "DataServerMismatch",
    "DummyDataProvider",
    "HttpDataProvider",
    "LabelledDataProvider",
    "LocalDataProvider",
    "OpenableLocation",
    "TcpDataProvider",
    "fetch_training_batch",
    "location_urls",
    "open_provider",
    "shuffle_in_place",
]
