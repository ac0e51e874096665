"""A client's log: one JSON object per line for each event (`--log json`), mixed with any
plain text a library printed. The one reader of it for the testnet, its audits and tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def parse_event(line: str) -> dict[str, Any] | None:
    """The event a log line holds, or None for plain text and torn or foreign lines."""
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None


def log_path(work_dir: Path, client: int) -> Path:
    """Where the testnet writes client `client`'s log (clients count from 1)."""
    return work_dir / f"client-{client}.log"


def client_events(work_dir: Path, client: int, name: str | None = None
                  ) -> Iterator[dict[str, Any]]:
    """The events of client `client`'s log in order (only those called `name`, if given);
    nothing if it has no log."""
    path = log_path(work_dir, client)
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        event = parse_event(line)
        if event is not None and (name is None or event["event"] == name):
            yield event
