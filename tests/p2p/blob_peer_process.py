"""A p2p node in its own process, for tests that SIGKILL a peer: it serves one blob of
`--size` zero bytes under the identity given as hex, prints `ADDRESS DIGEST`, then waits
(at most `--lifetime` seconds, so a forgotten process stops by itself). With `--fetch-from
ADDRESS DIGEST SIZE` it also downloads that blob from that node every 0.3 s, as a
restarted client does from its peers: it dials them before they dial it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from client_image.p2p import NodeConfig, P2PNode, PeerAddress
from psyche_common.identity import Identity


async def serve(secret_hex: str, size: int, lifetime_s: float,
                fetch_from: list[str] | None) -> None:
    async with P2PNode(Identity.from_hex(secret_hex), NodeConfig.loopback()) as node:
        digest = node.blob_store.add(bytes(size))
        print(node.address.direct_addresses[0], digest.hex(), flush=True)
        if not fetch_from:
            await asyncio.sleep(lifetime_s)
            return
        other = PeerAddress.parse(fetch_from[0])
        node.add_peer_addresses([other])
        for _ in range(int(lifetime_s / 0.3)):
            with contextlib.suppress(Exception):
                await node.blobs.download(bytes.fromhex(fetch_from[1]), int(fetch_from[2]),
                                          [other.node_id])
            await asyncio.sleep(0.3)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("secret_hex")
    parser.add_argument("--size", type=int, default=6338)
    parser.add_argument("--lifetime", type=float, default=60.0)
    parser.add_argument("--fetch-from", nargs=3, default=None)
    args = parser.parse_args()
    asyncio.run(serve(args.secret_hex, args.size, args.lifetime, args.fetch_from))
