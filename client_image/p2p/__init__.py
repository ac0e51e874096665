"""P2P layer of the client: iroh endpoints, gossip, verified blobs, model sharing.

Public surface (everything else in this package is private):

Identity
    ``Identity.load(path=None, environ=None)`` / ``.generate()`` / ``.from_file(p)`` /
    ``.from_hex(s)``; ``identity.public_key`` (32 bytes, the node id),
    ``identity.sign(msg) -> bytes``; ``sign(identity, msg)``,
    ``verify(pubkey, msg, sig) -> bool``. One Ed25519 key signs coordinator
    messages and names the node on iroh.
Node
    ``P2PNode(identity, NodeConfig(bind_ip, bind_port, bind_interface,
    relay_mode="disabled"|"default"|"custom", relay_urls), GossipConfig,
    DownloadConfig)``; ``await node.start()`` / ``await node.stop()`` or
    ``async with``; ``node.address.to_string()`` is what the coordinator's
    client list carries (``<hex id>@ip:port,...[;relay=url]``, see
    ``PeerAddress``); ``node.add_peer_addresses(strings)``;
    ``node.diagnostics() -> list[PeerDiagnostics]``.
Gossip
    ``topic = node.subscribe(run_id, bootstrap)``; ``await topic.broadcast(payload)``;
    ``async for message in topic.messages()`` (``GossipMessage(sender, payload,
    message_id)``); ``topic.stats`` (``GossipStats``: delivered, duplicates,
    forged, malformed, oversized, ...). Payloads: ``encode_broadcast`` /
    ``decode_broadcast`` of ``ResultAnnouncement`` and ``Finished``.
Blobs
    ``node.blob_store.add(data, tag) -> hash``; ``remove_tag``,
    ``remove_steps_before(step)``; ``await node.blobs.download(hash, size,
    providers) -> bytes`` (verified, retried across providers);
    ``await fetch_from_holders(node.blobs, hash, size, producer, others)`` fetches
    a result from any node holding it (a holder that has uploaded it enough
    redirects to others: ``HolderBook`` / ``HolderPolicy``).
Model sharing
    ``node.model_sharing.share(state_dict, config_json, tokenizer_json)``;
    ``await node.model_sharing.fetch_model(sources, ModelFetchOptions(...))``.

Importing this package applies the iroh 1.2.0 bulk-write fix (``iroh_patch``).
"""

from client_image.p2p.address import AddressError, PeerAddress
from client_image.p2p.blob_store import BlobStore, blob_hash, step_tag
from client_image.p2p.blobs import (
    BLOBS_ALPN,
    BlobDownloadError,
    BlobService,
    DownloadConfig,
    DownloadStats,
    RateLimiter,
)
from client_image.p2p.diagnostics import PeerDiagnostics
from client_image.p2p.gossip import (
    GOSSIP_ALPN,
    MAX_MESSAGE_BYTES,
    MAX_PAYLOAD_BYTES,
    Gossip,
    GossipConfig,
    GossipMessage,
    GossipStats,
    GossipTopic,
    SignedMessage,
    topic_for_run,
)
from client_image.p2p.holder_fetch import HolderFetchConfig, fetch_from_holders
from client_image.p2p.holders import HolderBook, HolderPolicy, ServeStats
from client_image.p2p.iroh_patch import (
    apply_bulk_write_patch,
    bulk_write_patch_active,
    remove_bulk_write_patch,
)
from client_image.p2p.messages import (
    BatchId,
    BroadcastDecodeError,
    Finished,
    ResultAnnouncement,
    decode_broadcast,
    encode_broadcast,
)
from client_image.p2p.model_sharing import (
    MODEL_SHARING_ALPN,
    ModelFetchOptions,
    ModelFetchReport,
    ModelManifest,
    ModelSharing,
    ModelSharingError,
)
from client_image.p2p.node import P2PNode
from client_image.p2p.transport import NodeConfig, TransportError
from psyche_common.identity import Identity, IdentityError, sign, verify

apply_bulk_write_patch()

__all__ = [
    "BLOBS_ALPN",
    "GOSSIP_ALPN",
    "MAX_MESSAGE_BYTES",
    "MAX_PAYLOAD_BYTES",
    "MODEL_SHARING_ALPN",
    "AddressError",
    "BatchId",
    "BlobDownloadError",
    "BlobService",
    "BlobStore",
    "BroadcastDecodeError",
    "DownloadConfig",
    "DownloadStats",
    "Finished",
    "Gossip",
    "GossipConfig",
    "GossipMessage",
    "GossipStats",
    "GossipTopic",
    "HolderBook",
    "HolderFetchConfig",
    "HolderPolicy",
    "Identity",
    "IdentityError",
    "ModelFetchOptions",
    "ModelFetchReport",
    "ModelManifest",
    "ModelSharing",
    "ModelSharingError",
    "NodeConfig",
    "P2PNode",
    "PeerAddress",
    "PeerDiagnostics",
    "RateLimiter",
    "ResultAnnouncement",
    "ServeStats",
    "SignedMessage",
    "TransportError",
    "apply_bulk_write_patch",
    "blob_hash",
    "bulk_write_patch_active",
    "decode_broadcast",
    "encode_broadcast",
    "fetch_from_holders",
    "remove_bulk_write_patch",
    "sign",
    "step_tag",
    "topic_for_run",
    "verify",
]
