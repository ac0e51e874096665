"""A local swarm of N clients exchanging training results over real iroh endpoints.

    .venv/bin/python -m bench.swarm [--sizes 4,16,64] [--rounds 2] [--result-bytes 3406]

Each simulated client is a real ``P2PNode`` (iroh endpoint on 127.0.0.1, blob
server with the holder policy), all in this process; no training and no
coordinator. Each round every client publishes one result of
``--result-bytes`` random bytes, then downloads every other client's result
with the client's own fetch (``fetch_from_holders``, as
``IrohPeers.download_result`` does: from any holder, redirected by busy ones)
and serves what it downloaded on. The default size, 3406 bytes, is the real
wire payload of one tiny-llama DisTrO result (Psyche's defaults: top-8 of
64-wide DCT chunks, 1-bit signs), as ``bench/distro.py --steps 2 --peers 2``
measures it (``payload_bytes_per_peer_step``); results here are random bytes
of that size.

Printed per N: bytes up and down per client per round, the producer's upload
per result in result sizes, the download overhead (the worst client's payload
bytes over the (N-1) results it needs; redirect and busy answers, a few dozen
bytes each, are counted apart as answers per download), the busiest server
over the mean upload, and the round's wall time (all N clients on this
machine's cores, so it grows with the swarm's total work, N²); then the fitted growth exponent of each in N
(log-log least squares); last, one JSON line with ``producer_upload_results_nN``,
``download_overhead_pct_nN``, ``max_serve_over_mean_nN`` for every N.
Peak RSS per client is not measured: all clients share one process here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from client_image.p2p import (
    DownloadConfig,
    NodeConfig,
    P2PNode,
    fetch_from_holders,
    step_tag,
)

ROOT = Path(__file__).resolve().parent.parent

TINY_LLAMA_RESULT_BYTES = 3406  # measured, see the docstring


@dataclass
class RoundFigures:
    up_bytes: list[int]  # per client
    down_bytes: list[int]  # per client
    producer_upload_results: list[float]  # per result, in result sizes
    control_answers: int  # redirect and busy answers, all servers together
    wall_s: float


async def one_round(nodes: list[P2PNode], step: int, size: int) -> RoundFigures:
    up_before = [n.blobs.holders.stats.bytes_sent for n in nodes]
    down_before = [n.blobs.stats.bytes_received for n in nodes]
    control_before = sum(n.blobs.holders.stats.redirects + n.blobs.holders.stats.busy
                         for n in nodes)
    digests = [n.blob_store.add(os.urandom(size), tag=step_tag("result", step)) for n in nodes]
    everyone = [n.node_id for n in nodes]

    async def fetch(node: P2PNode, producer: int) -> None:
        data, _ = await fetch_from_holders(
            node.blobs, digests[producer], size, everyone[producer], everyone)
        node.blob_store.add(data, tag=step_tag("downloaded-result", step))

    started = time.monotonic()
    await asyncio.gather(*(fetch(node, producer) for node in nodes
                           for producer in range(len(nodes)) if node is not nodes[producer]))
    wall = time.monotonic() - started
    figures = RoundFigures(
        up_bytes=[n.blobs.holders.stats.bytes_sent - b for n, b in zip(nodes, up_before, strict=True)],
        down_bytes=[n.blobs.stats.bytes_received - b for n, b in zip(nodes, down_before, strict=True)],
        producer_upload_results=[n.blobs.holders.bytes_sent(d) / size
                                 for n, d in zip(nodes, digests, strict=True)],
        control_answers=sum(n.blobs.holders.stats.redirects + n.blobs.holders.stats.busy
                            for n in nodes) - control_before,
        wall_s=wall,
    )
    for node in nodes:  # forget the step, as the client does two steps later
        node.blob_store.remove_steps_before(step + 1)
        node.blobs.holders.retain(node.blob_store.__contains__)
    return figures


async def run_swarm(count: int, rounds: int, size: int) -> dict[str, float]:
    downloads = DownloadConfig(read_timeout_s=10.0, total_timeout_s=120.0,
                               backoff_base_s=0.05, backoff_max_s=1.0)
    nodes = [P2PNode(config=NodeConfig.loopback(connect_timeout_s=5.0),
                     download_config=downloads) for _ in range(count)]
    try:
        await asyncio.gather(*(node.start() for node in nodes))
        for node in nodes:
            node.add_peer_addresses([other.address for other in nodes if other is not node])
        results = [await one_round(nodes, step, size) for step in range(rounds)]
    finally:
        await asyncio.gather(*(node.stop() for node in nodes), return_exceptions=True)
    needed = (count - 1) * size
    up = [b for r in results for b in r.up_bytes]
    down = [b for r in results for b in r.down_bytes]
    producer = [x for r in results for x in r.producer_upload_results]
    return {
        "up_bytes_per_client_round": statistics.mean(up),
        "down_bytes_per_client_round": statistics.mean(down),
        "producer_upload_results": statistics.mean(producer),
        "producer_upload_results_max": max(producer),
        "download_overhead_pct": 100.0 * (max(down) - needed) / needed,
        "max_serve_over_mean": max(max(r.up_bytes) / statistics.mean(r.up_bytes)
                                   for r in results),
        "control_answers_per_download": statistics.mean(
            r.control_answers / (count * (count - 1)) for r in results),
        "round_wall_s": statistics.mean(r.wall_s for r in results),
    }


def growth_exponent(sizes: list[int], values: list[float]) -> float | None:
    """Slope of log(value) against log(N); None when a value is not positive."""
    if len(sizes) < 2 or min(values) <= 0:
        return None
    fit = statistics.linear_regression([math.log(n) for n in sizes], [math.log(v) for v in values])
    return round(fit.slope, 3)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sizes wants numbers like 4,16,64, got {text!r}") from None
    if not sizes or min(sizes) < 2 or max(sizes) > 256:
        raise argparse.ArgumentTypeError(f"--sizes wants swarm sizes in 2..256, got {text!r}")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=[4, 16, 64],
                        help="comma-separated swarm sizes (2..256)")
    parser.add_argument("--rounds", type=int, default=2, choices=range(1, 21), metavar="1..20")
    parser.add_argument("--result-bytes", type=int, default=TINY_LLAMA_RESULT_BYTES,
                        help="size of one result (default: the tiny-llama DisTrO result)")
    args = parser.parse_args()
    if not 1 <= args.result_bytes <= 64 << 20:
        parser.error(f"--result-bytes must be in 1..{64 << 20}, got {args.result_bytes}")
    figures: dict[int, dict[str, float]] = {}
    for count in args.sizes:
        figures[count] = f = asyncio.run(run_swarm(count, args.rounds, args.result_bytes))
        print(f"N={count:3d}  up/client/round {f['up_bytes_per_client_round'] / 1e3:9.1f} KB  "
              f"down/client/round {f['down_bytes_per_client_round'] / 1e3:9.1f} KB  "
              f"producer upload {f['producer_upload_results']:.2f} results "
              f"(max {f['producer_upload_results_max']:.0f})  "
              f"download overhead {f['download_overhead_pct']:.1f}%  "
              f"max serve/mean {f['max_serve_over_mean']:.2f}  "
              f"redirect+busy answers/download {f['control_answers_per_download']:.2f}  "
              f"round {f['round_wall_s']:.2f} s", flush=True)
    sizes = sorted(figures)
    summary: dict[str, object] = {"result_bytes": args.result_bytes, "rounds": args.rounds}
    for name in ("up_bytes_per_client_round", "down_bytes_per_client_round",
                 "producer_upload_results", "max_serve_over_mean", "round_wall_s"):
        exponent = growth_exponent(sizes, [figures[n][name] for n in sizes])
        summary[f"growth_exponent_{name}"] = exponent
        print(f"growth exponent in N of {name}: {exponent}")
    for count in sizes:
        for name, value in figures[count].items():
            summary[f"{name}_n{count}"] = round(value, 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
