"""P2P benchmark: one verified blob over iroh vs plain TCP on loopback, and gossip latency.

    .venv/bin/python -m bench.p2p [--size-mib 256] [--gossip-nodes 16] [--unpatched]

Prints its figures, then, last, one JSON line:
``{"blob_mb_s", "tcp_mb_s", "ratio", "gossip_p99_ms", ...}``.
``--unpatched`` removes the iroh 1.2.0 bulk-write fix (client_image/p2p/iroh_patch.py)
first, to measure the binding's per-byte copy; use a small ``--size-mib`` with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import struct
import threading
import time

from client_image.p2p import (
    DownloadConfig,
    GossipConfig,
    NodeConfig,
    P2PNode,
    bulk_write_patch_active,
    remove_bulk_write_patch,
)

MB = 1e6


async def blob_throughput(size: int, parallel_streams: int = 1) -> float:
    """MB/s of one download of a ``size``-byte blob between two endpoints (verified)."""
    data = os.urandom(size)
    download = DownloadConfig(parallel_streams=parallel_streams, parallel_min_bytes=1 << 20)
    async with (
        P2PNode(config=NodeConfig.loopback()) as provider,
        P2PNode(config=NodeConfig.loopback(), download_config=download) as fetcher,
    ):
        digest = provider.blob_store.add(data)
        fetcher.add_peer_addresses([provider.address])
        started = time.perf_counter()
        fetched = await fetcher.blobs.download(digest, size, [provider.node_id])
        elapsed = time.perf_counter() - started
        assert fetched == data, "blob corrupted in transit"
        diagnostics = fetcher.diagnostics()
        if diagnostics:
            d = diagnostics[0]
            print(
                f"  path {d.connection_type} {d.remote_address} rtt {d.rtt_ms} ms lost packets {d.lost_packets}"
            )
    return size / elapsed / MB


def tcp_throughput(size: int, chunk: int = 1 << 20) -> float:
    """MB/s of a plain TCP socket on loopback moving ``size`` bytes."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    payload = os.urandom(chunk)
    received = 0

    def receive() -> None:
        nonlocal received
        connection, _ = listener.accept()
        buffer = bytearray(chunk)
        with connection:
            while received < size:
                n = connection.recv_into(buffer)
                if not n:
                    break
                received += n

    reader = threading.Thread(target=receive)
    reader.start()
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sender:
        for _ in range(size // chunk):
            sender.sendall(payload)
    reader.join(timeout=120)
    elapsed = time.perf_counter() - started
    listener.close()
    assert received == size // chunk * chunk
    return received / elapsed / MB


async def gossip_latency(
    nodes_count: int, messages_per_node: int, round_gap_s: float = 0.1, lazy_push: bool = False
) -> list[float]:
    """Latencies (ms) from broadcast to delivery, over every (message, receiver) pair.

    Each round every node broadcasts one message (a result announcement's size), then
    the round waits ``round_gap_s``: Psyche sends a few broadcasts per node per round.
    """
    config = GossipConfig(maintenance_interval_s=0.2, lazy_push=lazy_push)
    nodes = [
        P2PNode(config=NodeConfig.loopback(), gossip_config=config) for _ in range(nodes_count)
    ]
    await asyncio.gather(*(node.start() for node in nodes))
    try:
        topics = [
            node.subscribe("bench-run", [nodes[i - 1].address, nodes[i // 2].address] if i else [])
            for i, node in enumerate(nodes)
        ]
        deadline = time.monotonic() + 30
        while any(len(t.neighbours()) < 2 for t in topics) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        degrees = [len(t.neighbours()) for t in topics]
        print(
            f"  overlay degrees: min {min(degrees)} max {max(degrees)} (of {nodes_count - 1} peers)"
        )
        latencies: list[float] = []
        expected = nodes_count * messages_per_node * (nodes_count - 1)

        async def receive(topic_index: int) -> None:
            for _ in range(messages_per_node * (nodes_count - 1)):
                message = await topics[topic_index].next_message(30)
                (sent_at,) = struct.unpack(">d", message.payload[:8])
                latencies.append((time.perf_counter() - sent_at) * 1000)

        receivers = [asyncio.create_task(receive(i)) for i in range(nodes_count)]
        for _ in range(messages_per_node):
            for topic in topics:
                await topic.broadcast(struct.pack(">d", time.perf_counter()) + bytes(300))
            await asyncio.sleep(round_gap_s)
        await asyncio.gather(*receivers)
        assert len(latencies) == expected
        duplicates = sum(t.stats.duplicates for t in topics)
        grafts = sum(t.stats.grafts for t in topics)
        print(
            f"  {'PlumTree' if lazy_push else 'flooding'}: duplicates {duplicates}, grafts {grafts}"
        )
        return latencies
    finally:
        await asyncio.gather(*(node.stop() for node in nodes), return_exceptions=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=256, help="blob size (MiB)")
    parser.add_argument("--gossip-nodes", type=int, default=16)
    parser.add_argument("--gossip-messages", type=int, default=10, help="broadcasts per node")
    parser.add_argument("--gossip-round-gap-s", type=float, default=0.5)
    parser.add_argument(
        "--gossip-plumtree", action="store_true", help="PlumTree lazy push instead of flooding"
    )
    parser.add_argument(
        "--parallel-streams", type=int, default=4, help="streams for the parallel run"
    )
    parser.add_argument(
        "--unpatched", action="store_true", help="measure without the bulk-write fix"
    )
    args = parser.parse_args()
    if args.unpatched:
        remove_bulk_write_patch()
    size = args.size_mib << 20
    patched = bulk_write_patch_active()  # the package applied it at import

    print(
        f"blob: {args.size_mib} MiB over iroh on loopback (bulk-write patch {'on' if patched else 'off'})"
    )
    blob_mb_s = await blob_throughput(size)
    print(f"  {blob_mb_s:.1f} MB/s")
    print(f"blob: the same over {args.parallel_streams} parallel range streams")
    blob_parallel_mb_s = await blob_throughput(size, args.parallel_streams)
    print(f"  {blob_parallel_mb_s:.1f} MB/s")
    print(f"tcp: {args.size_mib} MiB over a plain socket on loopback")
    tcp_mb_s = tcp_throughput(size)
    print(f"  {tcp_mb_s:.1f} MB/s")
    print(
        f"gossip: {args.gossip_nodes} nodes x {args.gossip_messages} rounds of one broadcast each, {args.gossip_round_gap_s}s apart"
    )
    latencies = await gossip_latency(
        args.gossip_nodes, args.gossip_messages, args.gossip_round_gap_s, args.gossip_plumtree
    )
    p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
    print(
        f"  deliveries {len(latencies)} p50 {p50:.2f} ms p99 {p99:.2f} ms max {max(latencies):.2f} ms"
    )
    print(
        json.dumps(
            {
                "blob_mb_s": round(blob_mb_s, 1),
                "tcp_mb_s": round(tcp_mb_s, 1),
                "ratio": round(blob_mb_s / tcp_mb_s, 4),
                "blob_parallel_mb_s": round(blob_parallel_mb_s, 1),
                "parallel_streams": args.parallel_streams,
                "gossip_p99_ms": round(p99, 2),
                "gossip_p50_ms": round(p50, 2),
                "gossip_nodes": args.gossip_nodes,
                "gossip_lazy_push": args.gossip_plumtree,
                "size_mib": args.size_mib,
                "bulk_write_patch": patched,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
