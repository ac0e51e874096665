"""A client's log: one JSON object per line for each event (`--log json`), mixed with any
plain text a library printed. The one reader of it for the testnet, its audits, its TUI
(`describe_line`: a line in words) and tests."""

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


def describe_line(line: str) -> str:
    """A client's log line in words, for a status column: an event as its name and fields
    ("state: phase Warmup  epoch 0  step 0  clients 2"), a JSON log record as its message
    (with the level when above INFO), plain text as it is. Never the raw JSON."""
    line = line.strip()
    if not line.startswith("{"):
        return line
    try:
        data = json.loads(line)
    except ValueError:
        return line  # not JSON after all (or torn): the text is all there is
    if not isinstance(data, dict):
        return line
    if isinstance(data.get("event"), str):
        fields = {k: v for k, v in data.items() if k not in ("event", "time")}
        return f"{data['event']}: {_words(fields)}".rstrip(": ")
    if "message" in data:
        level = str(data.get("level") or "INFO")
        prefix = "" if level in ("INFO", "DEBUG") else f"{level.lower()}: "
        return prefix + _word(data["message"])
    return _words({k: v for k, v in data.items() if k != "time"})


def _words(fields: dict[str, Any]) -> str:
    return "  ".join(f"{key.replace('_', ' ')} {_word(value)}" for key, value in fields.items())


def _word(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return " ".join(_word(item) for item in value) or "none"
    if isinstance(value, dict):
        return _words(value) or "none"
    return str(value)


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
