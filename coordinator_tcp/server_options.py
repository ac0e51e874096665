"""What the coordinator server is told (`ServerOptions`) and what it counts (`ServerStats`)."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 20000
    save_state_dir: Path | None = None
    withdraw_on_disconnect: bool = True
    init_warmup_time: int | None = None
    tick_interval_s: float = 0.5
    heartbeat_interval_s: float = 5.0
    # Handshakes in flight (docs/tcp-admission.md): each connection holds a slot until its
    # signed join; one source address gets at most max_handshakes_per_address; a full
    # pool (max_handshakes, None: half the process's file descriptors) closes the one
    # longest past its deadline, else the oldest of the busiest address, for a newcomer.
    # Past handshake_timeout_s a connection is closed while the pool is at most half
    # full, else kept first in line: a flood reopens what is closed, all at once.
    handshake_timeout_s: float = 10.0
    max_handshakes: int | None = None
    max_handshakes_per_address: int = 16
    # After a restart from --save-state-dir, listed clients get this long to reconnect.
    reconnect_grace_s: float = 20.0
    # Check a Hub checkpoint report's commit against the repository's main branch before
    # applying it (coordinator_tcp.checkpoint_history); off for runs without network.
    checkpoint_history_check: bool = True
    # --events-dir: every state change, join, leave and refusal as event files
    # (coordinator_tcp.event_recording, docs/events.md).
    events_dir: Path | None = None


@dataclass
class ServerStats:
    connections_accepted: int = 0
    handshakes_failed: int = 0
    handshakes_refused_busy: int = 0  # its address already had its share in handshake
    handshakes_shed: int = 0  # closed in handshake to make room for a newcomer
    protocol_errors: int = 0
    rejected_events: int = 0
    broadcasts: int = 0
    last_errors: list[str] = field(default_factory=list)
    # Seconds from a change of state to its last write to a client, recent broadcasts.
    broadcast_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=4096))

    def note(self, text: str) -> None:
        self.last_errors = [*self.last_errors, text][-20:]

    def broadcast_ms(self) -> tuple[float, float] | None:
        """(p50, p99) of `broadcast_seconds` in milliseconds; None before any broadcast."""
        if not self.broadcast_seconds:
            return None
        ordered = sorted(self.broadcast_seconds)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return statistics.median(ordered) * 1000, p99 * 1000
