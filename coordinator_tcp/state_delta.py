"""The coordinator state a TCP server sends its clients: whole once, then binary deltas.

A whole state is about 52 KB with 256 clients and a round's 32 witnesses, and it changes
with every witness: sending it whole to N clients made each broadcast N x 52 KB. After a
connection's first state (and after it asks, `ResyncAddresses`) the server sends only a
bsdiff4 patch from the previous broadcast's bytes to the new ones (about 170 bytes for a
witness) with the number of the state it leads to (`state_seq`) and the first 16 hex
digits of the new bytes' SHA-256 (`state_digest`).

A receiver (`StateMirror`) keeps the last bytes it holds and their number; a patch that
does not follow them (a missed broadcast), does not apply, or gives bytes with another
digest is a gap: it asks for the whole state (once per gap) and ignores patches until
the whole state comes. Bytes it returns are always the server's.

    deltas = StateDeltas()                            # server
    seq, patch, digest = deltas.advance(encoded)      # at each broadcast (patch None: first)
    deltas.seq, deltas.current                        # the last broadcast

    mirror = StateMirror()                            # client
    state_bytes, ask = mirror.apply(update)           # None: nothing new to decode
    if ask: await connection.send(ResyncAddresses())

bsdiff4 is the BSDIFF40 format (bzip2-compressed control, diff and extra blocks); its
header declares the new length, checked against `MAX_STATE_BYTES` before patching.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct

import bsdiff4

from coordinator_tcp.protocol import StateUpdate

MAX_STATE_BYTES = 4 * 1024 * 1024  # a state with every list full is under 1 MB
_HEADER = struct.Struct("<8sqqq")  # magic, control length, diff length, new length


def state_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class StateDeltas:
    """The server's side: the bytes of the last broadcast, their number, and the patch
    from the previous ones."""

    def __init__(self) -> None:
        self.current: bytes | None = None
        self.seq = 0

    def advance(self, encoded: bytes) -> tuple[int, str | None, str]:
        """Make `encoded` the current state: (its number, the base64 patch from the
        previous state or None when there was none, its digest)."""
        previous, self.current = self.current, encoded
        self.seq += 1
        patch = None if previous is None else base64.b64encode(
            bsdiff4.diff(previous, encoded)).decode()
        return self.seq, patch, state_digest(encoded)


class StateMirror:
    """A receiver's copy of the server's state bytes, kept by applying each StateUpdate."""

    def __init__(self) -> None:
        self.current: bytes | None = None
        self.seq: int | None = None  # None: no whole state yet (or a gap since)
        self.asked = False  # a resync is on its way
        self.gaps = 0

    def reset(self) -> None:
        """A new connection: its first state comes whole."""
        self.current, self.seq, self.asked = None, None, False

    def apply(self, update: StateUpdate) -> tuple[bytes | None, bool]:
        """(the state's bytes after `update`, or None when it brought nothing usable;
        True when the whole state must be asked for: once per gap)."""
        if update.state:
            data = update.state_bytes
            self.current, self.seq, self.asked = data, update.state_seq or None, False
            return data, False
        if not update.state_delta:
            return None, False  # an update with neither (an older server sends whole states)
        if self.current is None or self.seq is None or update.state_seq != self.seq + 1:
            return None, self._gap()
        patched = _patch(self.current, update.state_delta)
        if patched is None or state_digest(patched) != update.state_digest:
            return None, self._gap()
        self.current, self.seq = patched, update.state_seq
        return patched, False

    def _gap(self) -> bool:
        if self.seq is not None:
            self.gaps += 1
        self.seq = None
        ask, self.asked = not self.asked, True
        return ask


def _patch(base: bytes, delta_b64: str) -> bytes | None:
    """`base` patched by the base64 bsdiff4 `delta_b64`, or None when it is not a valid
    patch (bad base64, header, declared length over MAX_STATE_BYTES, corrupt blocks)."""
    try:
        delta = base64.b64decode(delta_b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(delta) < _HEADER.size:
        return None
    magic, control, diff, new_length = _HEADER.unpack_from(delta)
    if (magic != b"BSDIFF40" or min(control, diff, new_length) < 0
            or new_length > MAX_STATE_BYTES or _HEADER.size + control + diff > len(delta)):
        return None
    try:
        return bytes(bsdiff4.patch(base, delta))
    except (ValueError, OSError, MemoryError, EOFError):
        return None


__all__ = ["MAX_STATE_BYTES", "StateDeltas", "StateMirror", "state_digest"]
