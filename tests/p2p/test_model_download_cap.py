"""The P2P model download cap, `--max-model-download-mbps` / MAX_MODEL_DOWNLOAD_MBPS: a
model fetched between two real iroh endpoints on loopback with the cap takes at least
size / cap, without it less; the flag and its environment variable reach the client's
config; a value that is not a rate above 0 is a one-line usage error."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from client_cli_probe import config_from, one_line_usage_error

from client_image.p2p import ModelFetchOptions
from client_image.p2p.model_sharing import MEGABIT_BYTES

from .swarm import started_nodes

pytestmark = pytest.mark.timeout(120)

CAP_MBPS = 16.0  # 2 MB/s
BURST = 1 << 20  # RateLimiter's default burst: the first MiB is free


def six_mb_model() -> dict[str, torch.Tensor]:
    """The model these cap tests move: the same 6 MB every time."""
    torch.manual_seed(7)
    return {f"layer{i}.weight": torch.randn(500_000) for i in range(3)}  # 3 x 2 MB fp32


async def fetch_seconds(cap_mbps: float | None) -> tuple[float, int]:
    """Seconds for a joiner to fetch a 6 MB model from one peer, and the bytes fetched."""
    state = six_mb_model()
    async with started_nodes(2) as (sharer, joiner):
        sharer.model_sharing.share(state, "{}")
        joiner.add_peer_addresses([sharer.address])
        options = ModelFetchOptions.of_client(8, cap_mbps)
        started = time.monotonic()
        _, fetched, report = await joiner.model_sharing.fetch_model([sharer.node_id], options)
        elapsed = time.monotonic() - started
    assert all(torch.equal(fetched[name], state[name]) for name in state)
    return elapsed, report.total_bytes


async def test_the_cap_slows_a_real_model_fetch_to_its_rate() -> None:
    capped, size = await fetch_seconds(CAP_MBPS)
    floor = (size - BURST) / (CAP_MBPS * MEGABIT_BYTES)
    assert size == 6_000_000
    assert capped >= floor, (capped, floor)
    uncapped, _ = await fetch_seconds(None)
    assert uncapped < floor, (uncapped, floor)


def test_the_flag_and_its_environment_variable_reach_the_config() -> None:
    assert config_from([], {}).p2p.max_model_download_mbps is None
    assert config_from(["--max-model-download-mbps", "250"], {}).p2p.max_model_download_mbps \
        == 250.0
    from_env = config_from([], {"MAX_MODEL_DOWNLOAD_MBPS": "12.5"})
    assert from_env.p2p.max_model_download_mbps == 12.5
    assert ModelFetchOptions.of_client(8, 12.5).bandwidth_bytes_per_second == 12.5 * 125_000


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--max-model-download-mbps", "0"], {}, "0 is not a rate: give megabits per second above 0"),
    (["--max-model-download-mbps", "-5"], {}, "-5 is not a rate: give megabits per second above 0"),
    (["--max-model-download-mbps", "nan"], {}, "nan is not a rate"),
    ([], {"MAX_MODEL_DOWNLOAD_MBPS": "0"}, "0 is not a rate"),
    (["--max-model-download-mbps", "fast"], {}, "Input should be a valid number"),
])
def test_a_value_that_is_not_a_rate_is_a_one_line_usage_error(
        args: list[str], env: dict[str, Any], message: str) -> None:
    one_line_usage_error(args, env, "--max-model-download-mbps", message)
