"""The P2P upload cap, `--max-upload-mbps` / MAX_UPLOAD_MBPS: what a client serves (the
model to joiners, its results to peers) goes through one token bucket. Measured on real
iroh endpoints on loopback: one joiner, then two at once, fetch a 6 MB model from a
capped sharer; the sharer's served bytes, sampled every 50 ms, stay under the cap within
5 % once its 1 MiB burst is spent, and near it (the cap, not something else, sets the
pace). A value that is not a rate above 0 is a one-line usage error."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch
from client_cli_probe import config_from, one_line_usage_error

from client_image.client_config import ClientConfig
from client_image.p2p import ModelFetchOptions, NodeConfig, P2PNode
from client_image.p2p.blobs import CAPPED_SERVE_CHUNK
from client_image.p2p.model_sharing import MEGABIT_BYTES
from client_image.runtime.client import ClientOptions, PsycheClient
from client_image.runtime.observability import EventLog
from psyche_common.identity import Identity

from .swarm import FAST_DOWNLOADS, FAST_GOSSIP, started_nodes
from .test_model_download_cap import six_mb_model

pytestmark = pytest.mark.timeout(120)

CAP_MBPS = 16.0  # 2 MB/s
CAP = CAP_MBPS * MEGABIT_BYTES
BURST = 1 << 20  # RateLimiter's default burst: the first MiB goes at once
TOLERANCE = 0.05


@contextlib.asynccontextmanager
async def capped_sharer(state: dict[str, torch.Tensor]) -> AsyncIterator[P2PNode]:
    node = P2PNode(config=NodeConfig.loopback(connect_timeout_s=1.0), gossip_config=FAST_GOSSIP,
                   download_config=FAST_DOWNLOADS, upload_bytes_per_second=CAP)
    async with node:
        node.model_sharing.share(state, "{}")
        yield node


async def serve_to(joiners: int) -> tuple[list[tuple[float, int]], int]:
    """The sharer's (seconds, bytes served) every 50 ms while `joiners` fetch its model at
    once, and the model's size; every joiner checks what it got."""
    state = six_mb_model()
    samples: list[tuple[float, int]] = []
    async with capped_sharer(state) as sharer, started_nodes(joiners) as fetchers:
        for joiner in fetchers:
            joiner.add_peer_addresses([sharer.address])

        async def fetch(joiner: P2PNode) -> int:
            _, fetched, report = await joiner.model_sharing.fetch_model(
                [sharer.node_id], ModelFetchOptions(max_concurrent_parameter_requests=8))
            assert all(torch.equal(fetched[name], state[name]) for name in state)
            return report.total_bytes

        async def sample(done: asyncio.Event) -> None:
            while not done.is_set():
                samples.append((time.monotonic(), sharer.blobs.bytes_served))
                await asyncio.sleep(0.05)

        done = asyncio.Event()
        sampler = asyncio.create_task(sample(done))
        started = time.monotonic()
        sizes = await asyncio.gather(*(fetch(joiner) for joiner in fetchers))
        done.set()
        await sampler
        samples.append((time.monotonic(), sharer.blobs.bytes_served))
    assert len(set(sizes)) == 1 and sharer.blobs.bytes_served == joiners * sizes[0]
    return [(at - started, served) for at, served in samples], sizes[0]


def steady_rate(samples: list[tuple[float, int]]) -> float:
    """Bytes per second served from when the burst was spent to the end."""
    first = next(s for s in samples if s[1] >= BURST + 4 * CAPPED_SERVE_CHUNK)
    last = samples[-1]
    assert last[0] - first[0] >= 1.5, samples  # long enough to measure a rate
    return (last[1] - first[1]) / (last[0] - first[0])


@pytest.mark.parametrize("joiners", [1, 2])
async def test_serving_stays_under_the_cap_on_a_real_transfer(joiners: int) -> None:
    samples, size = await serve_to(joiners)
    assert size == 6_000_000
    rate = steady_rate(samples)
    print(f"{joiners} joiner(s): steady upload {rate / MEGABIT_BYTES:.2f} Mbit/s under a cap "
          f"of {CAP_MBPS:g} ({rate / CAP:.3f} x cap); whole transfer {joiners * size} bytes "
          f"in {samples[-1][0]:.2f} s")
    assert rate <= CAP * (1 + TOLERANCE), (rate, CAP)
    assert rate >= CAP * 0.5, (rate, CAP)  # the cap sets the pace, not a slow machine
    floor = (joiners * size - BURST) / CAP  # the bucket's bound on the whole transfer
    assert samples[-1][0] >= floor * (1 - TOLERANCE), (samples[-1][0], floor)


def test_the_flag_and_its_environment_variable_reach_the_config() -> None:
    assert config_from([], {}).p2p.max_upload_mbps is None
    assert config_from(["--max-upload-mbps", "40"], {}).p2p.max_upload_mbps == 40.0
    assert config_from([], {"MAX_UPLOAD_MBPS": "2.5"}).p2p.max_upload_mbps == 2.5


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--max-upload-mbps", "0"], {}, "0 is not a rate: give megabits per second above 0"),
    (["--max-upload-mbps", "-5"], {}, "-5 is not a rate: give megabits per second above 0"),
    (["--max-upload-mbps", "inf"], {}, "inf is not a rate"),
    ([], {"MAX_UPLOAD_MBPS": "-1"}, "-1 is not a rate"),
    (["--max-upload-mbps", "fast"], {}, "Input should be a valid number"),
])
def test_a_value_that_is_not_a_rate_is_a_one_line_usage_error(
        args: list[str], env: dict[str, Any], message: str) -> None:
    one_line_usage_error(args, env, "--max-upload-mbps", message)


@pytest.mark.parametrize(("mbps", "limited"), [(40.0, True), (None, False)])
def test_the_client_gives_its_node_the_cap(mbps: float | None, limited: bool) -> None:
    client = PsycheClient(ClientOptions(ClientConfig.of(run_id="r", device="cpu",
                                                        max_upload_mbps=mbps),
                                        identity=Identity.generate(),
                                        node_config=NodeConfig.loopback()),
                          EventLog("none"))
    try:
        limiter = client.node.blobs.upload_limiter
        assert (limiter is not None) == limited
        if limiter is not None:
            assert limiter.rate == 40.0 * MEGABIT_BYTES == 5_000_000
    finally:
        client.worker.close()
