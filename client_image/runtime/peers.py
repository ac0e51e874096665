"""The round runner's `Peers` port over iroh: the run's gossip topic and the node's blobs.

    peers = IrohPeers(node, topic, ModelFetchOptions(...), progress=telemetry.model_progress)
    await peers.broadcast(Finished(step=3))          # encoded, signed, gossiped
    blob_hash = peers.publish_result(3, payload)    # served to anyone who asks
    data = await peers.download_result(blob_hash, size, sender, step, also_from=clients)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from client_image.p2p import (
    GossipTopic,
    ModelFetchOptions,
    ModelSharingError,
    P2PNode,
    encode_broadcast,
    fetch_from_holders,
    step_tag,
)
from client_image.runtime.ports import Broadcast, FetchedModel, ModelFetchFailed


class IrohPeers:
    def __init__(self, node: P2PNode, topic: GossipTopic, fetch_options: ModelFetchOptions,
                 progress: Callable[[int, int], None] | None = None):
        self.node = node
        self.topic = topic
        self.fetch_options = fetch_options
        self.progress = progress

    async def broadcast(self, message: Broadcast) -> None:
        await self.topic.broadcast(encode_broadcast(message))

    def publish_result(self, step: int, payload: bytes) -> bytes:
        return self.node.blob_store.add(payload, tag=step_tag("result", step))

    async def download_result(self, blob_hash: bytes, size: int, sender: bytes, step: int,
                              also_from: Sequence[bytes] = ()) -> bytes:
        # From any holder: the producer redirects us once it has uploaded the result a
        # couple of times (client_image/p2p/holder_fetch.py); verified by its hash.
        data, _ = await fetch_from_holders(self.node.blobs, blob_hash, size, sender, also_from)
        # Serve it on: the peers still missing it get it from us (and if the producer died).
        self.node.blob_store.add(data, tag=step_tag("downloaded-result", step))
        return data

    def forget_results_before(self, step: int) -> None:
        self.node.blob_store.remove_steps_before(step)
        self.node.blobs.holders.retain(lambda digest: digest in self.node.blob_store)

    async def fetch_model(self, sources: Sequence[bytes], step: int) -> FetchedModel:
        try:
            manifest, state_dict, report = await self.node.model_sharing.fetch_model(
                sources, self.fetch_options, progress=self.progress, step=step)
        except ModelSharingError as exc:
            raise ModelFetchFailed(str(exc)) from None
        return FetchedModel(manifest.config_json, manifest.tokenizer_json, state_dict,
                            peers=len(report.served_by), bytes=report.total_bytes)

    def share_model(self, weights: dict[str, torch.Tensor], config_json: str,
                    tokenizer_json: str | None, step: int) -> None:
        self.node.model_sharing.share(weights, config_json, tokenizer_json, step=step)

    def announce_loading(self, step: int, total_bytes: int) -> None:
        self.node.model_sharing.announce_loading(step, total_bytes)
