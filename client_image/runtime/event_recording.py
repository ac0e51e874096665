"""`psyche-client train --events-dir DIR`: every runtime event (client_image/runtime/events.py)
as event files (psyche_common.event_files, docs/events.md).

The source is `client-<first 16 hex digits of the node's key>`; the first record of each
process is `opened` (the whole key, the run id), then one record per event with the
event's NAME as kind and its fields as payload: what a `--logs json` line carries, in any
log mode. `--keep-event-files N` (KEEP_EVENT_FILES, Psyche's default 5) keeps the newest
N of this client's files.
"""

from __future__ import annotations

import logging
from pathlib import Path

from client_image.runtime.events import RuntimeEvent
from client_image.runtime.observability import EventLog
from psyche_common.event_files import KEEP_ALL_FILES, EventFileWriter

log = logging.getLogger(__name__)


def client_source(identity_hex: str) -> str:
    return f"client-{identity_hex[:16]}"


class ClientEventRecorder:
    """An `EventLog` listener writing each event to the client's event files."""

    def __init__(self, directory: Path, identity_hex: str, run_id: str, events: EventLog,
                 keep_files: int = KEEP_ALL_FILES):
        self.writer = EventFileWriter(directory, client_source(identity_hex),
                                      keep_files=keep_files)
        self.closed = False
        self.writer.write("opened", {"program": "psyche-client", "identity": identity_hex,
                                     "run_id": run_id})
        events.listeners.append(self.record)

    def record(self, event: RuntimeEvent) -> None:
        if self.closed:
            return
        try:
            self.writer.write(event.NAME, event.fields())
        except OSError as exc:  # a full disk loses the record, never the training
            log.warning("--events-dir: could not write a %s event: %s", event.NAME, exc)

    def close(self) -> None:
        self.closed = True
        self.writer.close()
