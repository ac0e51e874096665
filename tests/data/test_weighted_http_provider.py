"""WeightedHttp: a JSON of Http locations and weights, blended with Psyche's greedy index,
against a real HTTP server on 127.0.0.1 (range_http_server)."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from range_http_server import serve_directory

from client_image.data import DataProviderError, open_provider
from client_image.data.weighted import (
    WeightedDataProvider,
    build_weighted_index,
    open_weighted_http,
    shuffle_pairs,
)
from coordinator.config import DontShuffle, SeededShuffle, WeightedHttpDataLocation

SEED = list(range(32))


def http_location(url: str, shuffle: Any = "DontShuffle") -> dict[str, Any]:
    return {"location": {"SingleUrl": url}, "token_size_in_bytes": "TwoBytes",
            "shuffle": shuffle}


def numbered(base: str, folder: str, count: int) -> dict[str, Any]:
    return {"location": {"NumberedFiles": {"url_template": f"{base}/{folder}/{{}}.ds",
                                           "start_index": 0, "n_left_pad_zeros": 3,
                                           "num_files": count}},
            "token_size_in_bytes": "TwoBytes", "shuffle": "DontShuffle"}


def write_config(root: Path, config: Any, name: str = "mix.json") -> None:
    (root / name).write_text(json.dumps(config))


async def test_psyches_two_provider_example(tmp_path: Path) -> None:
    """Psyche's weighted/http.rs test: two data sets of two 16-byte files of one repeated
    byte each, equal weights, 3-token sequences; the blend alternates between them."""
    for folder, fill in (("provider_0", (1, 2)), ("provider_1", (3, 4))):
        (tmp_path / folder).mkdir()
        for n, byte in enumerate(fill):
            (tmp_path / folder / f"{n:03}.ds").write_bytes(bytes([byte]) * 16)
    with serve_directory(tmp_path) as server:
        write_config(tmp_path, {"shuffle": "DontShuffle", "providers": [
            [numbered(server.url, "provider_0", 2), 1.0],
            [numbered(server.url, "provider_1", 2), 1.0]]})
        provider = await open_provider(
            WeightedHttpDataLocation(url=f"{server.url}/mix.json"), 3, backoff_s=0.01)
        try:
            assert provider.num_sequences == 8
            batch = await provider.fetch(0, 7)
        finally:
            await provider.aclose()
    token = {byte: int.from_bytes(bytes([byte, byte]), "little") for byte in (1, 2, 3, 4)}
    assert batch.tolist() == [[token[b]] * 3 for b in (1, 3, 1, 3, 2, 4, 2, 4)]


def test_the_greedy_index_follows_the_weights_and_wraps_small_sets() -> None:
    datasets, samples = build_weighted_index(8, [0.75, 0.25], [2, 6])
    # i = 4: 0.75 * 4 - 3 == 0.25 * 4 - 1, a tie: the first data set.
    assert datasets == [0, 1, 0, 0, 0, 1, 0, 0]
    assert samples == [0, 0, 1, 0, 1, 1, 0, 1]  # data set 0 has 2 sequences: it wraps
    assert build_weighted_index(4, [1.0, 0.0], [3, 3]) == ([0, 0, 0, 0], [0, 1, 2, 0])


def test_the_seeded_shuffle_is_a_deterministic_permutation() -> None:
    datasets, samples = build_weighted_index(50, [0.5, 0.3, 0.2], [20, 20, 10])
    pairs = sorted(zip(datasets, samples, strict=True))
    shuffled = [list(datasets), list(samples)]
    shuffle_pairs(shuffled[0], shuffled[1], bytes(SEED))
    again = [list(datasets), list(samples)]
    shuffle_pairs(again[0], again[1], bytes(SEED))
    assert shuffled == again
    assert shuffled != [datasets, samples]
    assert sorted(zip(*shuffled, strict=True)) == pairs


class _Fake:
    """A provider whose sample n of data set d is [d * 100 + n] * 2."""

    def __init__(self, dataset: int, size: int) -> None:
        self.dataset, self.num_sequences = dataset, size
        self.asked: list[tuple[int, int]] = []

    async def fetch(self, start: int, end: int) -> torch.Tensor:
        self.asked.append((start, end))
        return torch.tensor([[self.dataset * 100 + n] * 2 for n in range(start, end + 1)])


async def test_a_fetch_asks_each_set_for_runs_and_keeps_the_order() -> None:
    small, large = _Fake(0, 2), _Fake(1, 6)
    provider = WeightedDataProvider([small, large], [0.75, 0.25], DontShuffle())
    batch = await provider.fetch(0, 7)
    assert batch[:, 0].tolist() == [0, 100, 1, 0, 1, 101, 0, 1]
    # Data set 0's sequences 0, 1, 0, 1, 0, 1 are fetched once, as one run; set 1's too.
    assert small.asked == [(0, 1)] and large.asked == [(0, 1)]


async def test_without_weights_each_set_weighs_its_length() -> None:
    provider = WeightedDataProvider([_Fake(0, 1), _Fake(1, 3)], None, DontShuffle())
    assert provider.weights == [0.25, 0.75]
    assert sorted(provider.sample_info(i) for i in range(4)) == [(0, 0), (1, 0), (1, 1), (1, 2)]


async def test_seeded_blends_are_the_same_on_every_client(tmp_path: Path) -> None:
    np.arange(41, dtype="<u2").tofile(tmp_path / "a.ds")  # HTTP, 4-token samples: 9
    np.arange(1000, 1021, dtype="<u2").tofile(tmp_path / "b.ds")  # 4
    with serve_directory(tmp_path) as server:
        write_config(tmp_path, {"shuffle": {"Seeded": SEED}, "providers": [
            http_location(f"{server.url}/a.ds"),
            http_location(f"{server.url}/b.ds", {"Seeded": SEED[::-1]})]})
        batches = []
        for _ in range(2):
            provider = await open_weighted_http(f"{server.url}/mix.json", 4, backoff_s=0.01)
            try:
                assert provider.num_sequences == 13
                batches.append(await provider.fetch(0, 12))
            finally:
                await provider.aclose()
    assert torch.equal(batches[0], batches[1])
    assert batches[0].shape == (13, 4)
    firsts = sorted(batches[0][:, 0].tolist())
    assert firsts == [*range(0, 36, 4), *range(1000, 1016, 4)]


@pytest.mark.parametrize(("config", "message"), [
    ("not json", "not JSON"),
    ({"providers": []}, "expected an object with exactly `shuffle` and `providers`"),
    ({"shuffle": "Sometimes", "providers": []}, "bad `shuffle`"),
    ({"shuffle": "DontShuffle", "providers": []}, "`providers` must be a non-empty list"),
    ({"shuffle": "DontShuffle", "providers": [[{"location": {}}, 1.0]]},
     "providers[0] is not an Http data location"),
    ({"shuffle": "DontShuffle", "providers": [["LOC", "heavy"]]},
     "providers[0] must be [location, weight (a number)]"),
    ({"shuffle": "DontShuffle", "providers": [["LOC", -1.0]]}, "weight -1.0, need a finite"),
    ({"shuffle": "DontShuffle", "providers": [["LOC", 0.0]]}, "the weights sum to 0"),
    ({"shuffle": "DontShuffle", "providers": [["LOC", 1.0], "LOC"]},
     "mixes [location, weight] pairs and bare locations"),
    ({"shuffle": "DontShuffle", "providers": [
        {"location": {"Gcp": {"bucket_name": ""}}, "token_size_in_bytes": "TwoBytes",
         "shuffle": "DontShuffle"}]}, "providers[0] is not an Http data location"),
    ({"shuffle": "DontShuffle", "providers": ["MISSING"]}, "HTTP 404"),
])
async def test_bad_configs_are_one_line_errors(tmp_path: Path, config: Any,
                                               message: str) -> None:
    np.arange(20, dtype="<u2").tofile(tmp_path / "a.ds")
    with serve_directory(tmp_path) as server:
        text = config if isinstance(config, str) else json.dumps(config)
        text = text.replace('"LOC"', json.dumps(http_location(f"{server.url}/a.ds")))
        text = text.replace('"MISSING"', json.dumps(http_location(f"{server.url}/nope.ds")))
        (tmp_path / "mix.json").write_text(text)
        with pytest.raises(DataProviderError) as info:
            await open_weighted_http(f"{server.url}/mix.json", 4, backoff_s=0.01)
        with pytest.raises(DataProviderError, match="HTTP 404"):
            await open_weighted_http(f"{server.url}/absent.json", 4)
    assert message in str(info.value) and "\n" not in str(info.value)


async def test_out_of_range_and_empty_sets() -> None:
    provider = WeightedDataProvider([_Fake(0, 2)], [1.0], SeededShuffle(seed=bytes(SEED)))
    with pytest.raises(DataProviderError, match=r"batch id \[1, 2\] out of range"):
        await provider.fetch(1, 2)
    with pytest.raises(DataProviderError, match="weighted data set 1 has no sequences"):
        WeightedDataProvider([_Fake(0, 2), _Fake(1, 0)], [1.0, 1.0], DontShuffle())
    with pytest.raises(DataProviderError, match="2 providers but 1 weights"):
        WeightedDataProvider([_Fake(0, 2), _Fake(1, 1)], [1.0], DontShuffle())
