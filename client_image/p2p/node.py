"""The P2P node the client runtime holds: one endpoint, gossip, blobs, model sharing."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType

from client_image.p2p.address import PeerAddress
from client_image.p2p.blob_store import BlobStore
from client_image.p2p.blobs import BlobService, DownloadConfig
from client_image.p2p.diagnostics import PeerDiagnostics
from client_image.p2p.gossip import Gossip, GossipConfig, GossipTopic
from client_image.p2p.model_sharing import ModelSharing
from client_image.p2p.transport import NodeConfig, Transport
from psyche_common.identity import Identity


class P2PNode:
    """A started/stopped P2P node; also an async context manager.

    >>> async with P2PNode(Identity.generate(), NodeConfig.loopback()) as node:
    ...     topic = node.gossip.subscribe("run-1", bootstrap=[PeerAddress.parse(s) for s in peers])
    ...     await topic.broadcast(encode_broadcast(announcement))
    """

    def __init__(
        self,
        identity: Identity | None = None,
        config: NodeConfig | None = None,
        gossip_config: GossipConfig | None = None,
        download_config: DownloadConfig | None = None,
        upload_bytes_per_second: float | None = None,
    ) -> None:
        self.identity = identity or Identity.generate()
        self.transport = Transport(self.identity, config)
        self.gossip = Gossip(self.transport, gossip_config)
        self.blob_store = BlobStore()
        self.blobs = BlobService(self.transport, self.blob_store, download_config,
                                 upload_bytes_per_second)
        self.model_sharing = ModelSharing(self.transport, self.blobs)

    async def start(self) -> P2PNode:
        await self.transport.start()
        return self

    async def stop(self) -> None:
        await self.gossip.stop()
        await self.transport.stop()

    async def __aenter__(self) -> P2PNode:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def node_id(self) -> bytes:
        return self.identity.public_key

    @property
    def address(self) -> PeerAddress:
        return self.transport.address

    def add_peer_addresses(self, addresses: Iterable[str | PeerAddress]) -> list[PeerAddress]:
        """Learn peers from the coordinator's client list (address strings are validated)."""
        parsed = [a if isinstance(a, PeerAddress) else PeerAddress.parse(a) for a in addresses]
        for address in parsed:
            self.transport.add_peer_address(address)
        return parsed

    def subscribe(self, run_id: str, bootstrap: Iterable[str | PeerAddress] = ()) -> GossipTopic:
        return self.gossip.subscribe(run_id, self.add_peer_addresses(bootstrap))

    def diagnostics(self) -> list[PeerDiagnostics]:
        return self.transport.diagnostics()
