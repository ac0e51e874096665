"""`psyche-coordinator run --events-dir DIR`: the server's events as event files
(psyche_common.event_files, docs/events.md), source `coordinator`.

Kinds: `opened` (once, at start: the run id), `state` (the state at start and after every
change the server broadcasts: the phase, epoch, step and client count in words, and the
whole state as `encoded`, base64 of `coordinator.encode_state`, which a replay decodes),
`joined` / `left` (a client or observer connection, by hex key), `refused` (a client
event the coordinator rejected: the error and its detail).
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator import CoordinatorState, decode_state, encode_state
from psyche_common.event_files import EventFileWriter, EventRecord

if TYPE_CHECKING:
    from coordinator_tcp.server import CoordinatorServer

SOURCE = "coordinator"
log = logging.getLogger(__name__)


def state_payload(state: CoordinatorState) -> dict[str, Any]:
    return {"run_state": state.run_state.name, "epoch": state.progress.epoch,
            "step": state.progress.step, "clients": len(state.epoch_state.clients),
            "encoded": base64.b64encode(encode_state(state)).decode()}


def state_of(record: EventRecord) -> CoordinatorState:
    """The coordinator state a `state` record holds (ValueError if it holds none)."""
    encoded = record.payload.get("encoded")
    if not isinstance(encoded, str):
        raise ValueError("a state record without its encoded state")
    try:
        return decode_state(base64.b64decode(encoded, validate=True))
    except Exception as exc:  # any decode failure is one bad record, not a crash
        raise ValueError(f"undecodable state: {exc}") from None


class CoordinatorEventRecorder:
    """Writes the server's events as they happen (`attach` subscribes it)."""

    def __init__(self, directory: Path) -> None:
        self.writer = EventFileWriter(directory, SOURCE)

    def attach(self, server: CoordinatorServer) -> None:
        self._write("opened", {"program": "psyche-coordinator", "run_id": server.state.run_id})
        self.state_changed(server.state)
        server.on_change.append(self.state_changed)
        server.on_peer_event.append(self._write)

    def state_changed(self, state: CoordinatorState) -> None:
        self._write("state", state_payload(state))

    def _write(self, kind: str, payload: dict[str, Any]) -> None:
        try:
            self.writer.write(kind, payload)
        except OSError as exc:  # a full disk loses the record, never the run
            log.warning("--events-dir: could not write a %s event: %s", kind, exc)

    def close(self) -> None:
        self.writer.close()
