"""The client's metrics JSON tells the run-manager's P2P panel, from two real iroh nodes on
loopback, how each peer is reached (direct here: no relay) and the bytes on the wire."""

from __future__ import annotations

import os

import pytest

from client_image.runtime.observability import Counters, snapshot
from psyche_common.metrics_schema import ClientMetrics
from tests.p2p.swarm import started_nodes

pytestmark = pytest.mark.timeout(60)


async def test_peers_are_direct_and_their_bytes_are_counted() -> None:
    async with started_nodes(2) as (a, b):
        b.add_peer_addresses([a.address.to_string()])
        data = os.urandom(300_000)
        digest = a.blob_store.add(data)
        assert await b.blobs.download(digest, len(data), [a.node_id]) == data
        served = ClientMetrics.model_validate_json(
            snapshot(Counters(), "0.1.0", b).model_dump_json())  # what the endpoint serves
    (peer,) = served.connected_peers
    assert peer.endpoint_id == a.node_id.hex() and peer.connection_type == "direct"
    assert served.p2p_bytes_received > len(data) > served.p2p_bytes_sent > 0
    assert snapshot(Counters(), "0.1.0", None).p2p_bytes_received == 0  # no node yet
