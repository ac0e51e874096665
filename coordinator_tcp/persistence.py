"""Atomic, checksummed persistence of the coordinator state for `--save-state-dir`.

Every state change is written to `state.bin` through a temporary file, fsync and rename,
so a crash leaves either the old or the new state, never half of one. The file is

    MAGIC (8 bytes "PSYSTATE") | format version (1 byte) | SHA-256 of the payload (32) |
    payload (the versioned `coordinator.encode_state` bytes)

and the state it replaces is kept as `state.prev.bin`. A restarted server resumes from
`state.bin`; one that is truncated, altered, of another format or not a file is refused
with an error that says so and names the previous good state; so is a `state.bin` that is
missing beside a `state.prev.bin`, or a link to nothing (a new run there would overwrite
the last good state within seconds). Only a directory that never held a state starts a
new run. Nothing is overwritten until a state has been read back: the operator decides
what to resume from.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from coordinator import CoordinatorState, StateDecodeError, decode_state, encode_state

STATE_FILE = "state.bin"
PREVIOUS_STATE_FILE = "state.prev.bin"
ADDRESSES_FILE = "p2p_addresses.json"
MAGIC = b"PSYSTATE"
FORMAT_VERSION = 1
_HEADER = len(MAGIC) + 1 + hashlib.sha256().digest_size


class PersistenceError(Exception):
    """A saved state directory or file that cannot be used (the message says why)."""


def seal(payload: bytes) -> bytes:
    """The bytes of a state file holding `payload`."""
    return MAGIC + bytes([FORMAT_VERSION]) + hashlib.sha256(payload).digest() + payload


def unseal(data: bytes, where: Path) -> bytes:
    """The payload of a state file, or PersistenceError naming what is wrong with it."""
    if len(data) < _HEADER or not data.startswith(MAGIC):
        if len(data) < _HEADER and MAGIC.startswith(data[: len(MAGIC)]):
            raise PersistenceError(f"{where}: truncated ({len(data)} bytes)")
        raise PersistenceError(f"{where}: not a saved coordinator state")
    version = data[len(MAGIC)]
    if version != FORMAT_VERSION:
        raise PersistenceError(
            f"{where}: saved in format {version}, this server reads format {FORMAT_VERSION}")
    digest, payload = data[len(MAGIC) + 1 : _HEADER], data[_HEADER:]
    if hashlib.sha256(payload).digest() != digest:
        raise PersistenceError(f"{where}: checksum mismatch, the file is corrupt "
                               f"(truncated or altered after it was written)")
    return payload


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
        if self.directory.exists() and not self.directory.is_dir():
            raise PersistenceError(f"{self.directory} is a file, not a directory")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PersistenceError(f"{self.directory}: cannot create it ({exc.strerror})") from None
        self._last: bytes | None = None

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_FILE

    def save(self, encoded_state: bytes, p2p_addresses: dict[str, str]) -> bool:
        """Write if the state changed since the last save; True when written."""
        if encoded_state == self._last:
            return False
        _atomic_write(self.directory / ADDRESSES_FILE, json.dumps(p2p_addresses).encode())
        if self._last is not None:
            _atomic_write(self.directory / PREVIOUS_STATE_FILE, seal(self._last))
        _atomic_write(self.state_path, seal(encoded_state))
        self._last = encoded_state
        return True

    def load(self) -> tuple[CoordinatorState, dict[str, str]] | None:
        """The saved state, or None when the directory holds none yet."""
        path = self.state_path
        if not path.exists():
            self._refuse_a_lost_state()
            return None
        if not path.is_file():
            raise PersistenceError(f"{path} is not a file")
        try:
            payload = unseal(path.read_bytes(), path)
            state = decode_state(payload)
        except (PersistenceError, StateDecodeError) as exc:
            raise PersistenceError(f"{exc}{self._previous_hint()}") from None
        addresses: dict[str, str] = {}
        addresses_path = self.directory / ADDRESSES_FILE
        if addresses_path.exists():
            try:
                loaded = json.loads(addresses_path.read_text())
                addresses = {str(k): str(v) for k, v in loaded.items()}
            except (ValueError, AttributeError, OSError) as exc:
                raise PersistenceError(f"{addresses_path}: {exc}") from exc
        self._last = encode_state(state)
        return state, addresses

    def _refuse_a_lost_state(self) -> None:
        """No `state.bin`: a new run may start only in a directory that held none. A
        dangling link (its volume not mounted, say) or a `state.prev.bin` left alone (the
        current file deleted) means a run's state is missing, and starting over would write
        over the last good state within seconds."""
        path, previous = self.state_path, self.directory / PREVIOUS_STATE_FILE
        if path.is_symlink():
            raise PersistenceError(f"{path} is a link to {path.readlink()}, which does not "
                                   f"exist{self._previous_hint()}")
        if previous.exists() or previous.is_symlink():
            intact = self._previous_hint()
            if intact:
                raise PersistenceError(f"{path} is missing{intact}")
            raise PersistenceError(f"{path} is missing and {previous} is no usable state "
                                   "either: use an empty directory to start over")

    def _previous_hint(self) -> str:
        previous = self.directory / PREVIOUS_STATE_FILE
        if not previous.is_file():
            return ""
        try:
            decode_state(unseal(previous.read_bytes(), previous))
        except (PersistenceError, StateDecodeError):
            return ""
        return (f"; the state before it is intact in {previous}: move it to {STATE_FILE} "
                "to resume from it, or use an empty directory to start over")
