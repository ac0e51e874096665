"""What the client tells people: event lines on stdout and the local metrics endpoint.

`--logs json` prints one JSON object per event (`{"event": "trained", "step": 3, ...}`),
`console` a readable line, `none` nothing; library logging goes to stderr.
`--metrics-local-port P` serves the `ClientMetrics` JSON (psyche_common.metrics_schema)
to any HTTP GET on 127.0.0.1:P, as Psyche's client does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from client_image.runtime.events import Ejected, EvalScored, Following, Removed, RuntimeEvent
from psyche_common.metrics_schema import (
    ClientMetrics,
    ConnectedPeer,
    Removal,
    RoundTripTime,
    SelectedPath,
)

LogMode = Literal["tui", "console", "json", "none"]
log = logging.getLogger(__name__)


class EventLog:
    """Prints each runtime event (typed, see events.py) in the chosen mode and hands it to
    every listener (telemetry, the TUI) whatever the mode."""

    def __init__(self, mode: LogMode = "console"):
        self.mode = mode
        self.listeners: list[Callable[[RuntimeEvent], None]] = []

    def emit(self, event: RuntimeEvent) -> None:
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:  # an observer's bug must not stop the runtime
                log.warning("event listener failed on %s", event.NAME, exc_info=True)
        if self.mode in ("none", "tui"):  # the TUI shows events through its listener
            return
        print(format_event(event, json_lines=self.mode == "json"), file=sys.stdout, flush=True)


def format_event(event: RuntimeEvent, *, json_lines: bool) -> str:
    """One line: `{"event": NAME, "time": ..., **fields}` or `HH:MM:SS NAME k=v ...`."""
    fields = event.fields()
    if json_lines:
        return json.dumps({"event": event.NAME, "time": round(time.time(), 3), **fields},
                          default=str)
    details = " ".join(f"{k}={v}" for k, v in fields.items())
    return f"{time.strftime('%H:%M:%S')} {event.NAME} {details}"


def configure_logging(mode: LogMode, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if mode == "json":
        class _Json(logging.Formatter):
            def format(self, record: logging.LogRecord) -> str:
                return json.dumps({"level": record.levelname, "logger": record.name,
                                   "message": record.getMessage(), "time": record.created})
        handler.setFormatter(_Json())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if mode != "none" else logging.WARNING)
    # httpx logs every request at INFO ("HTTP Request: POST ... 200 OK"): a Solana client
    # polls its RPC every second, and those lines would bury the events people read.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(level, logging.WARNING))


@dataclass
class Counters:
    """Psyche's client counters (docs/metrics.md, "Local metrics endpoint"), updated by the
    runtime."""

    broadcasts_seen: int = 0
    apply_message_success: int = 0
    apply_message_failure: int = 0
    apply_message_ignored: int = 0
    witnesses_sent: int = 0
    phase: str = ""
    epoch: int = 0
    step: int = 0
    round_step: int = 0
    role: Literal["NotInRound", "Trainer", "Witness"] = "NotInRound"
    loss: float | None = None
    tokens_per_sec: float = 0.0
    last_result_sizes: list[int] = field(default_factory=list)
    finishes_current: int = 0
    finishes_previous: int = 0
    announcements_current: int = 0
    announcements_previous: int = 0
    downloaded_current: int = 0
    downloaded_previous: int = 0
    result_bytes_received: int = 0  # verified peers' results (telemetry)
    model_params_downloaded: int = 0  # the last model fetch from peers: done of total
    model_params_total: int = 0
    # verification (runtime/verifying.py): replays that matched / did not, reports sent
    verifications_passed: int = 0
    verifications_failed: int = 0
    verification_reports_sent: int = 0
    # set by `observe` from the Following and Ejected events
    verification_following: int = 0  # trainers followed this epoch (0: none, or cannot replay)
    ejected_epoch: int | None = None  # the epoch of the last ejection of this client
    ejected_by: tuple[str, ...] = ()  # the followers (hex) whose reports ejected it
    evals: dict[str, dict[str, float]] = field(default_factory=dict)  # task -> metric -> last
    removals: dict[str, int] = field(default_factory=dict)  # reason -> times (runtime/removal.py)
    last_removal: Removed | None = None

    def observe(self, event: RuntimeEvent) -> None:
        """An `EventLog` listener for what the runtime tells only by event: the trainers
        this client follows, its ejection and its last eval scores. It sets values (never adds), so a second
        subscription changes nothing."""
        match event:
            case Following(trainers=trainers, able=able):
                self.verification_following = len(trainers) if able else 0
            case Ejected(epoch=epoch, reporters=reporters):
                self.ejected_epoch, self.ejected_by = epoch, tuple(reporters)
                self.verification_following = 0
            case EvalScored(task=task):
                self.evals = self.evals | {task: event.metrics()}
            case Removed(reason=reason):
                # Each Removed is emitted once (RemovalWatch), so counting it is safe here.
                self.removals = self.removals | {reason: self.removals.get(reason, 0) + 1}
                self.last_removal = event
            case _:
                pass


def snapshot(counters: Counters, client_version: str, node: Any | None,
             topic: Any | None = None) -> ClientMetrics:
    peers, neighbours, downloads = [], [], None
    sent = received = 0
    if node is not None:
        for diag in node.diagnostics():
            path = None
            if diag.remote_address and diag.rtt_ms is not None:
                path = SelectedPath(addr=diag.remote_address, rtt=RoundTripTime(
                    secs=diag.rtt_ms // 1000, nanos=(diag.rtt_ms % 1000) * 1_000_000))
            kind = diag.connection_type if diag.connection_type != "none" else None
            peers.append(ConnectedPeer(endpoint_id=diag.peer_hex, selected_path=path,
                                       connection_type=kind))
            sent, received = sent + diag.bytes_sent, received + diag.bytes_received
        downloads = node.blobs.stats
    if topic is not None:
        neighbours = [peer.hex() for peer in topic.neighbours()]
    return ClientMetrics(
        connected_peers=peers, round_step=counters.round_step, role=counters.role,
        broadcasts_seen=counters.broadcasts_seen,
        apply_message_success=counters.apply_message_success,
        apply_message_failure=counters.apply_message_failure,
        apply_message_ignored=counters.apply_message_ignored,
        finishes_received_current_round=counters.finishes_current,
        finishes_received_previous_round=counters.finishes_previous,
        result_announcements_received_current_round=counters.announcements_current,
        result_announcements_received_previous_round=counters.announcements_previous,
        results_downloaded_current_round=counters.downloaded_current,
        results_downloaded_previous_round=counters.downloaded_previous,
        witnesses_sent=counters.witnesses_sent, gossip_neighbors=neighbours,
        downloads_started=downloads.started if downloads else 0,
        downloads_finished=downloads.finished if downloads else 0,
        downloads_retry=downloads.retries if downloads else 0,
        downloads_failed=downloads.failed if downloads else 0,
        downloads_bytes=downloads.bytes_received if downloads else 0,
        p2p_bytes_sent=sent, p2p_bytes_received=received,
        model_params_downloaded=counters.model_params_downloaded,
        model_params_total=counters.model_params_total,
        client_version=client_version, phase=counters.phase, epoch=counters.epoch,
        step=counters.step, loss=counters.loss, tokens_per_sec=counters.tokens_per_sec,
        last_result_sizes=counters.last_result_sizes,
        verification_following=counters.verification_following,
        verifications_passed=counters.verifications_passed,
        verifications_failed=counters.verifications_failed,
        verification_reports_sent=counters.verification_reports_sent,
        ejected=counters.ejected_epoch is not None, ejected_epoch=counters.ejected_epoch,
        ejected_by=list(counters.ejected_by), evals=counters.evals,
        removals=counters.removals, removal=None if (gone := counters.last_removal) is None
        else Removal(epoch=gone.epoch, step=gone.step, reason=gone.reason, detail=gone.detail))


class MetricsPortInUse(Exception):
    """The metrics port is taken (another client on this host?): one line for the user."""


class MetricsServer:
    """Answers every HTTP request on 127.0.0.1:port with the current ClientMetrics JSON."""

    def __init__(self, port: int, render: Any):
        self.port = port
        self.render = render
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        try:
            # reuse_address: a restart binds at once although the last client's closed
            # connections still sit in TIME-WAIT on the port (asyncio's default on Unix,
            # said here because the run-manager's port check relies on it).
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port,
                                                      reuse_address=True)
        except OSError as error:
            raise MetricsPortInUse(
                f"--metrics-local-port {self.port}: cannot listen on 127.0.0.1:{self.port} "
                f"({os.strerror(error.errno) if error.errno else error}); is another client "
                "running on this host?"
            ) from None

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            body = self.render().model_dump_json().encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode()
                         + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        except Exception:
            log.exception("metrics endpoint")
        finally:
            writer.close()
