"""Gossip per run over iroh: signed broadcasts flooded over a bounded neighbour set.

Public surface: ``Gossip`` (the node's service, ``subscribe(run_id, bootstrap)``),
``GossipTopic`` (``broadcast``, ``messages()``, ``stats``), ``GossipConfig``,
``GossipMessage``, ``GossipStats``, ``SignedMessage``, ``GossipWireError``,
``topic_for_run``, ``GOSSIP_ALPN``, ``MAX_MESSAGE_BYTES``, ``MAX_PAYLOAD_BYTES``.

Modules:

- ``topic``: ``GossipTopic``, one run's membership (HyParView-like active and
  passive views) and dissemination (eager push, optionally PlumTree lazy push);
- ``service``: ``Gossip``, accepts neighbour streams on ``GOSSIP_ALPN`` and routes
  them to the subscribed topics;
- ``tree``: ``BroadcastTree``, PlumTree's eager/lazy bookkeeping, IHAVE/GRAFT/PRUNE;
- ``wire``: run topics, signed messages and frame encodings;
- ``types``: configuration, counters, delivered messages and per-neighbour state.
"""

from client_image.p2p.gossip.service import Gossip
from client_image.p2p.gossip.topic import GossipTopic
from client_image.p2p.gossip.types import GossipConfig, GossipMessage, GossipStats
from client_image.p2p.gossip.wire import (
    GOSSIP_ALPN,
    MAX_MESSAGE_BYTES,
    MAX_PAYLOAD_BYTES,
    GossipWireError,
    SignedMessage,
    topic_for_run,
)

__all__ = [
    "GOSSIP_ALPN",
    "MAX_MESSAGE_BYTES",
    "MAX_PAYLOAD_BYTES",
    "Gossip",
    "GossipConfig",
    "GossipMessage",
    "GossipStats",
    "GossipTopic",
    "GossipWireError",
    "SignedMessage",
    "topic_for_run",
]
