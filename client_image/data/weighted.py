"""Weighted HTTP data provider: Psyche's `WeightedHttp = "url"` data location
(shared/data-provider/src/weighted/{mod.rs,http.rs}).

The URL serves a JSON document

    {"shuffle": "DontShuffle" | {"Seeded": [32 bytes]},
     "providers": [[<Http location>, weight], ...]      (explicitly weighted)
               or [<Http location>, ...]}               (weighted by their lengths)

where an Http location is the JSON form of the `Http` data location
(`{"location": {"SingleUrl": "..."}, "token_size_in_bytes": "TwoBytes", "shuffle":
"DontShuffle"}`). Each location becomes an HttpDataProvider; weights are normalised to
their sum (or, without weights, each data set's number of sequences is its weight).

The blend has as many sequences as all data sets together, N = sum of their lengths.
Index i (0 <= i < N) takes the data set d that maximises w_d * max(i, 1) - drawn_d
(drawn_d: how many of d's sequences the indices before i took; the first such data set on
a tie), and from d the next sequence in order, 0, 1, 2, ...; once d has given all of its
sequences it gives drawn_d mod len_d (Psyche's greedy `build_weighted_index`). With a
Seeded shuffle the (data set, sequence) pairs are then permuted by a Fisher-Yates pass
downwards, i = N-1 .. 1 swapping i with `gen_range(0..=i)` of ChaCha8Rng::from_seed (rand
0.9: a u32 drawn by Canon's method while i fits in a u32). The shuffle is ported from
Psyche's source; it has no recorded vectors from the Rust code here.

A fetch groups the requested indices by data set, asks each data set once for each run
of consecutive (distinct) sequence indices, and returns the samples in the order asked.
All data sets must have the same max_seq_len (the run's); a data set with no sequence
is an error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

import httpx
import numpy as np
import torch
from pydantic import TypeAdapter, ValidationError

from client_image.data.http import HttpDataProvider
from coordinator.config import HttpDataLocation, SeededShuffle
from coordinator.data_location import SHUFFLE, Shuffle
from psyche_common.token_files.chacha import ChaChaRng
from psyche_common.token_files.sequences import DataProviderError, check_batch

_SHUFFLE: TypeAdapter[Any] = TypeAdapter(Annotated[Shuffle, SHUFFLE])
_U32_MAX = 2**32 - 1


class WeightedConfig:
    """The parsed JSON of a WeightedHttp URL."""

    def __init__(self, shuffle: Shuffle, locations: list[HttpDataLocation],
                 weights: list[float] | None) -> None:
        self.shuffle = shuffle
        self.locations = locations
        self.weights = weights

    @classmethod
    def from_json(cls, data: Any, where: str = "weighted config") -> WeightedConfig:
        if not isinstance(data, dict) or set(data) != {"shuffle", "providers"}:
            raise DataProviderError(
                f"{where}: expected an object with exactly `shuffle` and `providers`")
        try:
            shuffle = _SHUFFLE.validate_python(data["shuffle"])
        except ValidationError as exc:
            raise DataProviderError(f"{where}: bad `shuffle`: {_first_error(exc)}") from None
        providers = data["providers"]
        if not isinstance(providers, list) or not providers:
            raise DataProviderError(f"{where}: `providers` must be a non-empty list")
        weighted = [isinstance(p, list) for p in providers]
        if any(weighted) and not all(weighted):
            raise DataProviderError(
                f"{where}: `providers` mixes [location, weight] pairs and bare locations")
        locations: list[HttpDataLocation] = []
        weights: list[float] | None = [] if all(weighted) else None
        for n, entry in enumerate(providers):
            raw = entry
            if weights is not None:
                if (len(entry) != 2 or isinstance(entry[1], bool)
                        or not isinstance(entry[1], int | float)):
                    raise DataProviderError(
                        f"{where}: providers[{n}] must be [location, weight (a number)]")
                raw, weight = entry
                if not weight >= 0 or weight == float("inf"):
                    raise DataProviderError(
                        f"{where}: providers[{n}] has weight {weight}, need a finite number >= 0")
                weights.append(float(weight))
            try:
                locations.append(HttpDataLocation.model_validate(raw))
            except ValidationError as exc:
                raise DataProviderError(
                    f"{where}: providers[{n}] is not an Http data location: {_first_error(exc)}"
                ) from None
        if weights is not None and sum(weights) <= 0:
            raise DataProviderError(f"{where}: the weights sum to 0")
        return cls(shuffle, locations, weights)


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    loc = ".".join(str(part) for part in error["loc"])
    return f"{loc}: {error['msg']}" if loc else str(error["msg"])


def normalize(weights: Sequence[float]) -> list[float]:
    total = sum(weights)
    return [w / total for w in weights]


def build_weighted_index(n_samples: int, weights: Sequence[float],
                         sizes: Sequence[int]) -> tuple[list[int], list[int]]:
    """Psyche's greedy blend: (data set, sequence index) for each of n_samples indices."""
    drawn = [0] * len(weights)
    dataset_index: list[int] = []
    sample_index: list[int] = []
    candidates = [d for d, size in enumerate(sizes) if size]
    for i in range(n_samples):
        at = float(max(i, 1))
        chosen, best = 0, float("-inf")
        for d in candidates:
            error = weights[d] * at - drawn[d]
            if error > best:
                chosen, best = d, error
        # The next unseen sequence until all are seen, then drawn mod size: the same value.
        sample_index.append(drawn[chosen] % sizes[chosen])
        dataset_index.append(chosen)
        drawn[chosen] += 1
    return dataset_index, sample_index


def shuffle_pairs(dataset_index: list[int], sample_index: list[int], seed: bytes) -> None:
    """Psyche's `shuffle`: Fisher-Yates downwards with ChaCha8 `gen_range(0..=i)`."""
    rng = ChaChaRng(seed)
    for i in range(len(dataset_index) - 1, 0, -1):
        if i >= _U32_MAX:
            raise DataProviderError(f"cannot shuffle {len(dataset_index)} sequences: "
                                    "rand's u64 path is not ported")
        j = rng.random_below(i + 1)
        dataset_index[i], dataset_index[j] = dataset_index[j], dataset_index[i]
        sample_index[i], sample_index[j] = sample_index[j], sample_index[i]


class WeightedDataProvider:
    """A blend of providers (each with num_sequences and async fetch(start, end))."""

    def __init__(self, providers: Sequence[Any], weights: Sequence[float] | None,
                 shuffle: Shuffle) -> None:
        if weights is not None and len(weights) != len(providers):
            raise DataProviderError(
                f"{len(providers)} providers but {len(weights)} weights")
        sizes = [int(p.num_sequences) for p in providers]
        for n, size in enumerate(sizes):
            if size == 0:
                raise DataProviderError(f"weighted data set {n} has no sequences")
        self.providers = list(providers)
        self.weights = normalize(weights if weights is not None else [float(s) for s in sizes])
        total = sum(sizes)
        dataset_index, sample_index = build_weighted_index(total, self.weights, sizes)
        if isinstance(shuffle, SeededShuffle):
            shuffle_pairs(dataset_index, sample_index, shuffle.seed)
        self._dataset_index = np.asarray(dataset_index, dtype=np.int64)
        self._sample_index = np.asarray(sample_index, dtype=np.int64)

    @property
    def num_sequences(self) -> int:
        return len(self._dataset_index)

    def sample_info(self, index: int) -> tuple[int, int]:
        """(data set, sequence index in it) of blended index `index`."""
        return int(self._dataset_index[index]), int(self._sample_index[index])

    async def fetch(self, start: int, end: int) -> torch.Tensor:
        """Samples start..end (inclusive) as an int64 tensor [end - start + 1, max_seq_len]."""
        check_batch(start, end, self.num_sequences)
        datasets = self._dataset_index[start : end + 1]
        samples = self._sample_index[start : end + 1]
        rows: list[torch.Tensor] = []
        fetched: dict[tuple[int, int], torch.Tensor] = {}
        for d in sorted(set(datasets.tolist())):
            wanted = sorted(set(samples[datasets == d].tolist()))
            for first, last in _consecutive_runs(wanted):
                got = await self.providers[d].fetch(first, last)
                for n, row in zip(range(first, last + 1), got, strict=True):
                    fetched[(d, n)] = row
        for d, n in zip(datasets.tolist(), samples.tolist(), strict=True):
            rows.append(fetched[(d, n)])
        return torch.stack(rows)

    async def aclose(self) -> None:
        for provider in self.providers:
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()


def _consecutive_runs(wanted: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct sequence indices as (first, last) runs of consecutive ones (a
    sequence asked twice in a batch, a small data set wrapping, is fetched once)."""
    runs: list[tuple[int, int]] = []
    for n in wanted:
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


async def open_weighted_http(url: str, max_seq_len: int, *, timeout_s: float = 5.0,
                             **http_options: Any) -> WeightedDataProvider:
    """GET the JSON at `url`, open each Http location and blend them."""
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        raise DataProviderError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 400:
        raise DataProviderError(f"GET {url}: HTTP {response.status_code}")
    try:
        data = json.loads(response.content)
    except ValueError as exc:
        raise DataProviderError(f"{url}: not JSON: {exc}") from None
    config = WeightedConfig.from_json(data, url)
    providers: list[HttpDataProvider] = []
    try:
        for location in config.locations:
            provider = await HttpDataProvider.open(
                location, max_seq_len, timeout_s=timeout_s, **http_options)
            providers.append(provider)  # opened ones are closed if a later one fails
        return WeightedDataProvider(providers, config.weights, config.shuffle)
    except BaseException:
        for provider in providers:
            await provider.aclose()
        raise


__all__ = [
    "WeightedConfig", "WeightedDataProvider", "build_weighted_index", "normalize",
    "open_weighted_http", "shuffle_pairs",
]
