"""Atomic persistence of the coordinator state for `--save-state-dir`.

Every state change is written to `state.bin` (the versioned `coordinator.encode_state`
bytes) through a temporary file, fsync and rename, so a crash leaves either the old or
the new state, never half of one. A restarted server resumes from it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from coordinator import CoordinatorState, StateDecodeError, decode_state, encode_state

STATE_FILE = "state.bin"
ADDRESSES_FILE = "p2p_addresses.json"


class PersistenceError(Exception):
    """A saved state that cannot be read back."""


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


@dataclass
class StateStore:
    directory: Path

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._last: bytes | None = None

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_FILE

    def save(self, encoded_state: bytes, p2p_addresses: dict[str, str]) -> bool:
        """Write if the state changed since the last save; True when written."""
        if encoded_state == self._last:
            return False
        _atomic_write(self.directory / ADDRESSES_FILE, json.dumps(p2p_addresses).encode())
        _atomic_write(self.state_path, encoded_state)
        self._last = encoded_state
        return True

    def load(self) -> tuple[CoordinatorState, dict[str, str]] | None:
        """The saved state, or None when the directory holds none yet."""
        if not self.state_path.exists():
            return None
        data = self.state_path.read_bytes()
        try:
            state = decode_state(data)
        except StateDecodeError as exc:
            raise PersistenceError(f"{self.state_path}: {exc}") from exc
        addresses: dict[str, str] = {}
        addresses_path = self.directory / ADDRESSES_FILE
        if addresses_path.exists():
            try:
                loaded = json.loads(addresses_path.read_text())
                addresses = {str(k): str(v) for k, v in loaded.items()}
            except (ValueError, AttributeError) as exc:
                raise PersistenceError(f"{addresses_path}: {exc}") from exc
        self._last = encode_state(state)
        return state, addresses
