"""The client's P2P traffic as the P2P panel shows it: upload and download rates and its
peers by path (direct or through a relay), as plain text (no Textual: `--no-tui` too).

The client's metrics carry byte counters, not rates (`p2p_bytes_sent`,
`p2p_bytes_received`: summed over its current iroh connections), so the rates are taken
here between two samples. A counter that goes down (connections closed, or a restarted
client) starts the next interval afresh instead of showing a negative rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from psyche_common.metrics_schema import ClientMetrics
from psyche_common.ui.view import format_bytes


@dataclass
class P2PView:
    up_bytes_per_s: float | None = None
    down_bytes_per_s: float | None = None
    direct: int = 0
    relayed: int = 0
    peers: int = 0
    """Connected peers, including those whose path is not known yet."""
    seen: bool = False
    """Metrics arrived at least once."""
    model_downloaded: int = 0
    model_total: int = 0
    """The client's last model fetch from peers: parameters in hand, of this many."""
    _last: tuple[float, int, int] | None = None  # (time, sent, received) of the last sample

    def sample(self, metrics: ClientMetrics, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.seen = True
        self.peers = len(metrics.connected_peers)
        self.direct = sum(1 for p in metrics.connected_peers if p.connection_type == "direct")
        self.relayed = sum(1 for p in metrics.connected_peers if p.connection_type == "relay")
        self.model_downloaded = metrics.model_params_downloaded
        self.model_total = metrics.model_params_total
        sent, received = metrics.p2p_bytes_sent, metrics.p2p_bytes_received
        last, self._last = self._last, (now, sent, received)
        if last is None or now <= last[0]:
            return
        elapsed = now - last[0]
        if sent >= last[1]:
            self.up_bytes_per_s = (sent - last[1]) / elapsed
        if received >= last[2]:
            self.down_bytes_per_s = (received - last[2]) / elapsed


def describe_p2p(view: P2PView) -> list[str]:
    """    ↑ 12.0 KiB/s  ↓ 1.5 MiB/s
    peers 3: 2 direct, 1 relayed"""
    if not view.seen:
        return ["p2p: no client metrics"]

    def rate(value: float | None) -> str:
        return "—" if value is None else f"{format_bytes(value)}/s"

    unknown = view.peers - view.direct - view.relayed
    peers = f"peers {view.peers}: {view.direct} direct, {view.relayed} relayed"
    lines = [f"↑ {rate(view.up_bytes_per_s)}  ↓ {rate(view.down_bytes_per_s)}",
             peers + (f", {unknown} path unknown" if unknown else "")]
    if model_fetching(view):
        lines.append(f"model from peers: {view.model_downloaded / view.model_total:.0%} "
                     f"of {view.model_total} parameters")
    return lines


def model_fetching(view: P2PView) -> bool:
    """A model fetch from peers is under way (its bar is shown)."""
    return view.model_total > 0 and view.model_downloaded < view.model_total
