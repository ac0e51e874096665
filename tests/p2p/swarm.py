"""Local swarm fixtures: real iroh endpoints on 127.0.0.1 with relays disabled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from client_image.p2p import DownloadConfig, GossipConfig, GossipTopic, NodeConfig, P2PNode

FAST_GOSSIP = GossipConfig(maintenance_interval_s=0.1, handshake_timeout_s=3.0)
FAST_DOWNLOADS = DownloadConfig(
    read_timeout_s=3.0, total_timeout_s=30.0, backoff_base_s=0.05, backoff_max_s=0.5
)


@contextlib.asynccontextmanager
async def started_nodes(
    count: int,
    gossip_config: GossipConfig = FAST_GOSSIP,
    download_config: DownloadConfig = FAST_DOWNLOADS,
) -> AsyncIterator[list[P2PNode]]:
    nodes = [
        P2PNode(
            config=NodeConfig.loopback(connect_timeout_s=1.0),
            gossip_config=gossip_config,
            download_config=download_config,
        )
        for _ in range(count)
    ]
    try:
        await asyncio.gather(*(node.start() for node in nodes))
        yield nodes
    finally:
        await asyncio.gather(*(node.stop() for node in nodes), return_exceptions=True)


async def wait_until(
    condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll ``condition`` every 20 ms; fail after ``timeout`` instead of hanging."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def subscribe_chain(nodes: Sequence[P2PNode], run_id: str) -> list[GossipTopic]:
    """Node i bootstraps from node i-1 only: a line the overlay grows from."""
    topics = []
    for index, node in enumerate(nodes):
        bootstrap = [nodes[index - 1].address] if index else []
        topics.append(node.subscribe(run_id, bootstrap))
    return topics


async def collect(topic: GossipTopic, count: int, timeout: float) -> list[bytes]:
    return [(await topic.next_message(timeout)).payload for _ in range(count)]


Predicate = Callable[[], Awaitable[bool]]
