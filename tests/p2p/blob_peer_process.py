"""A p2p node in its own process, for tests that SIGKILL a peer: it serves one blob of
`--size` zero bytes under the identity given as hex, prints `ADDRESS DIGEST`, then waits
(at most `--lifetime` seconds, so a forgotten process stops by itself)."""

from __future__ import annotations

import argparse
import asyncio

from client_image.p2p import NodeConfig, P2PNode
from psyche_common.identity import Identity


async def serve(secret_hex: str, size: int, lifetime_s: float) -> None:
    async with P2PNode(Identity.from_hex(secret_hex), NodeConfig.loopback()) as node:
        digest = node.blob_store.add(bytes(size))
        print(node.address.direct_addresses[0], digest.hex(), flush=True)
        await asyncio.sleep(lifetime_s)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("secret_hex")
    parser.add_argument("--size", type=int, default=6338)
    parser.add_argument("--lifetime", type=float, default=60.0)
    args = parser.parse_args()
    asyncio.run(serve(args.secret_hex, args.size, args.lifetime))
