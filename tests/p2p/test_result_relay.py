"""Training results outlive their producer: a peer that downloaded one serves it on."""

from __future__ import annotations

import os

import pytest

from client_image.p2p import ModelFetchOptions
from client_image.runtime.peers import IrohPeers

from .swarm import started_nodes

pytestmark = pytest.mark.timeout(60)


async def test_a_result_is_fetched_from_a_peer_that_has_it_after_its_producer_died() -> None:
    async with started_nodes(3) as (producer, holder, late):
        for node in (producer, holder, late):
            node.add_peer_addresses([other.address for other in (producer, holder, late)])
        peers = {node.node_id: IrohPeers(node, node.subscribe("relay", []), ModelFetchOptions())
                 for node in (producer, holder, late)}
        payload = os.urandom(6338)
        blob = peers[producer.node_id].publish_result(7, payload)
        everyone = [producer.node_id, holder.node_id, late.node_id]
        got = await peers[holder.node_id].download_result(
            blob, len(payload), producer.node_id, 7, also_from=everyone)
        assert got == payload
        await producer.stop()  # died after announcing; only the holder has its result now
        got = await peers[late.node_id].download_result(
            blob, len(payload), producer.node_id, 7, also_from=everyone)
        assert got == payload
        # The relayed copy is tagged by step, so it is dropped with the step's results.
        peers[holder.node_id].forget_results_before(8)
        assert holder.blob_store.get(blob) is None
