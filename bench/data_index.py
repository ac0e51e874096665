"""The token-file sequence index and a batch fetch, before and after the index became arrays.
Prints one line per figure, then ONE JSON line.

    .venv/bin/python -m bench.data_index [--sequences 500000] [--batch 64] [--repeats 3]

Index: `--sequences` samples of 2048 two-byte tokens over 100 files (only the sizes: no
file is needed to build an index), DontShuffle and Seeded. Time is the best of
`--repeats`; memory is what tracemalloc counts for the index kept (numpy's buffers
included).

    before  a list of one frozen dataclass per sequence, shuffled with chacha.py's
            reference loop: the code before the arrays, copied here (`_object_index`)
    after   psyche_common.token_files.sequences.build_sequence_index

Fetch: a Seeded data set of 4 real files (4096 samples of 2048 tokens, 32 MiB) in a
temporary directory; a batch of `--batch` data indices (scattered over the files):

    local   LocalDataProvider.get_samples (after) vs the old per-sample slice of a byte
            memmap joined into bytes (before)
    http    HttpDataProvider.fetch from a loopback Range server (tests/data/range_http_server.py),
            16 range reads in flight (after) vs one at a time (before: RANGE_READS_IN_FLIGHT = 1);
            again with 20 ms added before each read (_wan20ms: a simulated internet round
            trip, which loopback cannot have)

JSON fields: index_build_s_500k, index_bytes_500k (Seeded, after), the same with _before,
index_build_s_500k_unshuffled(_before), fetch_local_s_batch<B>(_before),
fetch_http_s_batch<B>[_wan20ms](_before). The `_500k` names hold whatever --sequences was.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from client_image.data import http as http_module
from coordinator.config import (
    DontShuffle,
    HttpDataLocation,
    SeededShuffle,
    TokenSize,
)
from psyche_common.token_files import LocalDataProvider
from psyche_common.token_files.chacha import shuffle_in_place
from psyche_common.token_files.sequences import build_sequence_index

REPO = Path(__file__).resolve().parents[1]

SEQ_LEN = 2048
SAMPLE_BYTES = SEQ_LEN * 2
SEED = bytes(range(32))


@dataclass(frozen=True)
class _SequenceRef:  # the old index entry
    file_index: int
    byte_offset: int


def _object_index(sizes: list[int], sample_bytes: int, shuffle: object) -> list[_SequenceRef]:
    """The old build_sequence_index (local rule, no reserve)."""
    refs = [_SequenceRef(f, offset) for f, size in enumerate(sizes)
            for offset in range(0, max(size - sample_bytes, 0), sample_bytes)]
    if isinstance(shuffle, SeededShuffle):
        shuffle_in_place(refs, shuffle.seed)
    return refs


def _measure(build: Callable[[], Any], repeats: int) -> tuple[float, int]:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        build()
        best = min(best, time.perf_counter() - started)
    tracemalloc.start()
    kept = build()
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return best, used


def _old_get_samples(provider: LocalDataProvider, refs: list[_SequenceRef],
                     maps: list[np.memmap], start: int, end: int) -> np.ndarray:
    """The old LocalDataProvider.get_samples: bytes of each sample, joined, then decoded."""
    chunks = [bytes(maps[r.file_index][r.byte_offset : r.byte_offset + SAMPLE_BYTES])
              for r in refs[start : end + 1]]
    return np.frombuffer(b"".join(chunks), dtype="<u2").astype(np.int64).reshape(-1, SEQ_LEN)


def _best_of(repeats: int, run: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


class _SimulatedWanLatency:
    """A RangeReader that waits `delay_s` before each read: the round trip to a data host on
    the internet, which the loopback server (under a millisecond) cannot show."""

    def __init__(self, reader: Any, delay_s: float) -> None:
        self.reader, self.delay_s = reader, delay_s

    async def read_range(self, url: str, offset: int, length: int) -> bytes:
        await asyncio.sleep(self.delay_s)
        return await self.reader.read_range(url, offset, length)

    async def aclose(self) -> None:
        await self.reader.aclose()


async def _http_fetch_times(root: Path, batch: int, repeats: int,
                            delay_s: float) -> tuple[float, float]:
    from http.server import ThreadingHTTPServer

    from tests.data.range_http_server import serve_directory

    # The stdlib server listens with a backlog of 5: 16 connects at once overflow it and
    # the dropped SYNs come back after the kernel's 1 s retransmit. Any real web server
    # listens with hundreds.
    ThreadingHTTPServer.request_queue_size = 128
    with serve_directory(root) as control:
        urls = [f"{control.url}/{p.name}" for p in sorted(root.iterdir())]
        location = HttpDataLocation.model_validate({
            "location": {"UrlList": urls}, "token_size_in_bytes": "TwoBytes",
            "shuffle": {"Seeded": list(SEED)}})
        provider = await http_module.HttpDataProvider.open(location, SEQ_LEN)
        if delay_s:
            provider._reader = _SimulatedWanLatency(provider._reader, delay_s)
        try:
            times = {}
            for in_flight in (1, http_module.RANGE_READS_IN_FLIGHT):
                http_module.RANGE_READS_IN_FLIGHT = in_flight
                best = float("inf")
                for r in range(repeats):
                    started = time.perf_counter()
                    await provider.fetch(r * batch, (r + 1) * batch - 1)
                    best = min(best, time.perf_counter() - started)
                times[in_flight] = best
        finally:
            await provider.aclose()
    return times[http_module.RANGE_READS_IN_FLIGHT], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    files = 100
    per_file = args.sequences // files
    # A local file of n*B + one token holds n samples (an exact multiple would hold n-1).
    sizes = [per_file * SAMPLE_BYTES + 2] * files
    report: dict[str, float | int] = {}
    shuffles: list[tuple[DontShuffle | SeededShuffle, str]] = [
        (DontShuffle(), "_unshuffled"), (SeededShuffle(seed=SEED), "")]
    for shuffle, suffix in shuffles:
        after_s, after_bytes = _measure(
            partial(build_sequence_index, sizes, SAMPLE_BYTES, 0, shuffle), args.repeats)
        before_s, before_bytes = _measure(
            partial(_object_index, sizes, SAMPLE_BYTES, shuffle), args.repeats)
        name = type(shuffle).__name__
        print(f"index {name:12s} {files * per_file} sequences: before {before_s:.3f} s "
              f"{before_bytes / 2**20:.1f} MiB, after {after_s:.3f} s {after_bytes / 2**20:.1f} MiB")
        report[f"index_build_s_500k{suffix}"] = round(after_s, 4)
        report[f"index_build_s_500k{suffix}_before"] = round(before_s, 4)
        if not suffix:
            report["index_bytes_500k"] = after_bytes
            report["index_bytes_500k_before"] = before_bytes

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rng = np.random.default_rng(0)
        for i in range(4):
            tokens = rng.integers(0, 32_000, 1024 * SEQ_LEN + 1, dtype=np.uint16)
            (root / f"part-{i}.ds").write_bytes(tokens.astype("<u2").tobytes())
        provider = LocalDataProvider(root, SEQ_LEN, TokenSize.TwoBytes, SeededShuffle(seed=SEED))
        file_sizes = [p.stat().st_size for p in provider.files]
        refs = _object_index(file_sizes, SAMPLE_BYTES, SeededShuffle(seed=SEED))
        maps = [np.memmap(p, dtype=np.uint8, mode="r") for p in provider.files]
        end = args.batch - 1
        same = np.array_equal(provider.get_samples(0, end).numpy(),
                              _old_get_samples(provider, refs, maps, 0, end))
        local_after = _best_of(args.repeats * 3, lambda: provider.get_samples(0, end))
        local_before = _best_of(args.repeats * 3,
                                lambda: _old_get_samples(provider, refs, maps, 0, end))
        print(f"local fetch of {args.batch} samples: before {local_before * 1e3:.2f} ms, "
              f"after {local_after * 1e3:.2f} ms (same samples: {same})")
        in_flight = http_module.RANGE_READS_IN_FLIGHT
        http: dict[str, float] = {}
        for delay_s, suffix in [(0.0, ""), (0.02, "_wan20ms")]:
            after, before = asyncio.run(_http_fetch_times(root, args.batch, args.repeats, delay_s))
            http_module.RANGE_READS_IN_FLIGHT = in_flight
            http[suffix], http[suffix + "_before"] = after, before
            print(f"http fetch of {args.batch} samples, +{delay_s * 1e3:.0f} ms a read: one read "
                  f"at a time {before * 1e3:.1f} ms, {in_flight} in flight {after * 1e3:.1f} ms")
    batch = args.batch
    report[f"fetch_local_s_batch{batch}"] = round(local_after, 5)
    report[f"fetch_local_s_batch{batch}_before"] = round(local_before, 5)
    for suffix, seconds in http.items():
        report[f"fetch_http_s_batch{batch}{suffix}"] = round(seconds, 4)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
