"""Gossip wire format: run topics, signed messages and control frames.

Signed message (at most ``MAX_MESSAGE_BYTES`` = 4096 bytes on the wire)::

    sender (32-byte Ed25519 public key) ‖ signature (64) ‖ payload

The signature covers ``SIGNING_DOMAIN ‖ topic ‖ payload`` so a message cannot
be replayed into another run's topic. Its id is SHA-256 of the whole encoded
message; Ed25519 signatures are deterministic, so one (sender, payload) pair
always has the same id and de-duplication is exact.

Each gossip frame (inside the length prefix of ``framing``) is
``kind (1 byte) ‖ body``: HELLO / ACCEPT / REJECT bodies are small JSON
objects; a MESSAGE body is one signed message.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from psyche_common.identity import (
    PUBLIC_KEY_BYTES,
    SIGNATURE_BYTES,
    Identity,
    verify,
)

GOSSIP_ALPN = b"psyche/gossip/0"
TOPIC_PREFIX = b"psyche gossip"
SIGNING_DOMAIN = b"psyche-gossip-message/v1"
MAX_MESSAGE_BYTES = 4096
ENVELOPE_OVERHEAD = PUBLIC_KEY_BYTES + SIGNATURE_BYTES
MAX_PAYLOAD_BYTES = MAX_MESSAGE_BYTES - ENVELOPE_OVERHEAD
MAX_CONTROL_BYTES = 16 * 1024
# Largest frame we accept at all: a message or a control frame, plus its kind byte.
MAX_FRAME_BYTES = 1 + max(MAX_MESSAGE_BYTES, MAX_CONTROL_BYTES)
# An oversized frame up to this size is skipped; beyond it the neighbour is dropped.
MAX_SKIPPABLE_FRAME_BYTES = 1 << 20
GOSSIP_WIRE_VERSION = 1


class GossipWireError(ValueError):
    """A malformed gossip frame or message."""


class FrameKind(enum.IntEnum):
    HELLO = 1
    ACCEPT = 2
    REJECT = 3
    MESSAGE = 4
    IHAVE = 5  # body: message ids (32 bytes each) we have, for a lazy neighbour
    PRUNE = 6  # body: empty; "you are lazy for me now"
    GRAFT = 7  # body: message ids to send us; "you are eager for me now"


def topic_for_run(run_id: str) -> bytes:
    """topic = SHA-256("psyche gossip" ‖ run_id), as in Psyche."""
    return hashlib.sha256(TOPIC_PREFIX + run_id.encode("utf-8")).digest()


@dataclass(frozen=True)
class SignedMessage:
    sender: bytes
    signature: bytes
    payload: bytes

    def encode(self) -> bytes:
        return self.sender + self.signature + self.payload

    @property
    def message_id(self) -> bytes:
        return hashlib.sha256(self.encode()).digest()

    @classmethod
    def create(cls, identity: Identity, topic: bytes, payload: bytes) -> SignedMessage:
        if len(payload) > MAX_PAYLOAD_BYTES:
            raise GossipWireError(
                f"gossip payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES} "
                f"(messages are at most {MAX_MESSAGE_BYTES} bytes signed)"
            )
        signature = identity.sign(SIGNING_DOMAIN + topic + payload)
        return cls(identity.public_key, signature, payload)

    @classmethod
    def decode(cls, raw: bytes) -> SignedMessage:
        if len(raw) > MAX_MESSAGE_BYTES:
            raise GossipWireError(f"signed message of {len(raw)} bytes exceeds {MAX_MESSAGE_BYTES}")
        if len(raw) < ENVELOPE_OVERHEAD:
            raise GossipWireError(
                f"signed message of {len(raw)} bytes is shorter than its {ENVELOPE_OVERHEAD}-byte header"
            )
        sender = raw[:PUBLIC_KEY_BYTES]
        signature = raw[PUBLIC_KEY_BYTES:ENVELOPE_OVERHEAD]
        return cls(sender, signature, raw[ENVELOPE_OVERHEAD:])

    def is_authentic(self, topic: bytes) -> bool:
        return verify(self.sender, SIGNING_DOMAIN + topic + self.payload, self.signature)


def encode_control(kind: FrameKind, body: dict[str, Any]) -> bytes:
    return bytes([kind]) + json.dumps({"v": GOSSIP_WIRE_VERSION, **body}).encode()


def encode_message_frame(message: SignedMessage) -> bytes:
    return bytes([FrameKind.MESSAGE]) + message.encode()


def split_frame(frame: bytes) -> tuple[FrameKind, bytes]:
    if not frame:
        raise GossipWireError("empty gossip frame")
    try:
        kind = FrameKind(frame[0])
    except ValueError:
        raise GossipWireError(f"unknown gossip frame kind {frame[0]}") from None
    return kind, frame[1:]


def decode_control(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_CONTROL_BYTES:
        raise GossipWireError(f"control frame of {len(body)} bytes exceeds {MAX_CONTROL_BYTES}")
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise GossipWireError(f"control frame is not JSON: {error}") from None
    except RecursionError:
        raise GossipWireError("control frame is JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise GossipWireError("control frame is not a JSON object")
    if value.get("v") != GOSSIP_WIRE_VERSION:
        raise GossipWireError(f"unsupported gossip wire version {value.get('v')!r}")
    return value
