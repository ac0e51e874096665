"""Per-peer connection diagnostics: direct or relayed, RTT, bytes in and out.

A plain snapshot the metrics exporter (``psyche_peer_connections``,
``psyche_connection_latency_seconds``, bandwidth) can read without touching iroh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import iroh

ConnectionType = Literal["direct", "relay", "none"]


@dataclass(frozen=True)
class PeerDiagnostics:
    peer: bytes
    connection_type: ConnectionType
    remote_address: str | None
    rtt_ms: int | None
    bytes_sent: int
    bytes_received: int
    lost_packets: int
    connections: int

    @property
    def peer_hex(self) -> str:
        return self.peer.hex()


def snapshot_connection(peer: bytes, connections: Sequence[iroh.Connection]) -> PeerDiagnostics:
    """Sum counters over a peer's connections; path and RTT come from the selected path."""
    sent = received = lost = 0
    connection_type: ConnectionType = "none"
    remote_address: str | None = None
    rtts: list[int] = []
    for connection in connections:
        stats = connection.stats()
        sent += stats.udp_tx_bytes
        received += stats.udp_rx_bytes
        lost += stats.lost_packets
        rtt = connection.rtt()
        if rtt is not None:
            rtts.append(rtt)
        for path in connection.paths():
            # one direct path is enough to call the peer direct
            if path.is_selected and (path.is_ip or connection_type == "none"):
                connection_type = "direct" if path.is_ip else "relay"
                remote_address = path.remote_addr
    return PeerDiagnostics(
        peer=peer,
        connection_type=connection_type,
        remote_address=remote_address,
        rtt_ms=min(rtts) if rtts else None,
        bytes_sent=sent,
        bytes_received=received,
        lost_packets=lost,
        connections=len(connections),
    )
