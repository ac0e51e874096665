"""A stand-in for `PsycheClient` where a test needs only what its views read.

`ClientTelemetry`, `ClientApp` and the metrics snapshot read a client's counters, event
log, P2P node (download stats, connection diagnostics), gossip topic and states; this
holds real `Counters`, a real `EventLog` and real `DownloadStats`, with no node, coordinator
or model behind them (no peers: `diagnostics()` is empty).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from client_image.p2p.blobs import DownloadStats
from client_image.runtime.observability import Counters, EventLog, snapshot
from psyche_common.metrics_schema import ClientMetrics


@dataclass
class StandInNode:
    """The P2P node's part the views read: its download stats, and no peer connections."""

    stats: DownloadStats = field(default_factory=DownloadStats)

    @property
    def blobs(self) -> StandInNode:
        return self

    def diagnostics(self) -> list[Any]:
        return []


@dataclass
class StandInClient:
    """What ClientTelemetry and ClientApp read of a PsycheClient."""

    counters: Counters = field(default_factory=Counters)
    events: EventLog = field(default_factory=lambda: EventLog("none"))
    node: StandInNode = field(default_factory=StandInNode)
    topic: Any = None
    state: Any = None
    last_server_state: Any = None
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    observe: bool = True
    """The counters follow the events, as a PsycheClient's do (False: set by the test)."""

    def __post_init__(self) -> None:
        if self.observe:
            self.events.listeners.append(self.counters.observe)

    def metrics(self) -> ClientMetrics:
        return snapshot(self.counters, "test", None)

    async def run(self) -> int:
        await self.stop_event.wait()
        return 0

    def stop(self, exit_code: int = 0) -> None:
        self.stop_event.set()
