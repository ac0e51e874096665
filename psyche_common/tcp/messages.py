"""The envelope and handshake messages every TCP connection of a run speaks.

One connection = one identity:

    server -> client   Challenge{nonce}
    client -> server   Join{run_id, identity, p2p_address, client_version, replay_class,
                            signature = Ed25519(identity, JOIN_DOMAIN || nonce || run_id || 0 || p2p_address)}
    server -> client   Welcome (or a protocol-specific welcome) | ErrorReply(fatal) and close

The coordinator protocol (`coordinator_tcp.protocol`) and the data-server protocol
(`coordinator_tcp.data_protocol`) add their own messages on top of these. Every message
is a JSON object with `type` and `version`; anything else is a `ProtocolError` naming
what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from psyche_common.identity import Identity

# 2: the coordinator's StateUpdate carries the p2p address map as numbered changes after
# a whole first map (coordinator_tcp.addresses); 1 sent the whole map in every state.
PROTOCOL_VERSION = 3  # 3: coordinator states as deltas (coordinator_tcp.state_delta)
JOIN_DOMAIN = b"psyche-tcp-join/1"


def _hex_parser(length: int) -> Callable[[object], bytes]:
    def parse(value: object) -> bytes:
        if isinstance(value, bytes):
            raw = value
        elif isinstance(value, str):
            try:
                raw = bytes.fromhex(value)
            except ValueError as exc:
                raise ValueError(f"not a hex string: {exc}") from exc
        else:
            raise ValueError("expected a hex string")
        if len(raw) != length:
            raise ValueError(f"expected {length} bytes, got {len(raw)}")
        return raw

    return parse


_AS_HEX = PlainSerializer(lambda b: b.hex(), return_type=str)
Bytes32 = Annotated[bytes, BeforeValidator(_hex_parser(32)), _AS_HEX]
Bytes64 = Annotated[bytes, BeforeValidator(_hex_parser(64)), _AS_HEX]


class Message(BaseModel):
    """Every frame is one JSON object with `type` and `version`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    version: Literal[3] = 3  # PROTOCOL_VERSION


# ------------------------------------------------------------------ server -> client
class Challenge(Message):
    type: Literal["challenge"] = "challenge"
    nonce: Bytes32


class Welcome(Message):
    type: Literal["welcome"] = "welcome"
    identity: Bytes32


class Heartbeat(Message):
    type: Literal["heartbeat"] = "heartbeat"
    server_time: int


class ErrorReply(Message):
    type: Literal["error"] = "error"
    error: str
    detail: str = ""
    fatal: bool = False


# ------------------------------------------------------------------ client -> server
class Join(Message):
    type: Literal["join"] = "join"
    run_id: str = Field(max_length=32)
    identity: Bytes32
    p2p_address: str = Field(max_length=1024)
    client_version: str = Field(default="", max_length=96)
    signature: Bytes64
    observe: bool = False
    # The u16 hash of the machine it replays DisTrO results on (issue 36; 0 = none): the
    # coordinator keeps it in the client's state entry and elects followers by it.
    replay_class: int = Field(default=0, ge=0, le=65535)

    @field_validator("run_id")
    @classmethod
    def _run_id_bytes(cls, value: str) -> str:
        if len(value.encode()) > 32:
            raise ValueError("run_id is at most 32 bytes")
        return value


# Refusals of a join that retrying cannot fix: clients stop instead of reconnecting.
PERMANENT_JOIN_ERRORS = frozenset({"WrongRunId", "BadSignature"})


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol version."""


class VersionMismatch(ProtocolError):
    """The peer speaks another protocol version: retrying will not change that."""

    def __init__(self, theirs: object):
        super().__init__(f"unsupported protocol version {theirs!r}: this side speaks "
                         f"{PROTOCOL_VERSION} (run a client and coordinator of the same "
                         "release)")
        self.theirs = theirs


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "message"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def encode(message: BaseModel) -> bytes:
    return message.model_dump_json().encode()


def parse_envelope(frame: bytes, kind: str) -> dict[str, Any]:
    """JSON object with a supported `version` and a `type`, or a ProtocolError saying
    which of those is wrong (checked before the per-type validation so that a peer
    speaking another version is told so, not shown a list of field errors)."""
    try:
        data = json.loads(frame)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"invalid {kind} message: not JSON ({exc})") from None
    except RecursionError:  # a hostile peer's [[[[...]]]]: refused, never a traceback
        raise ProtocolError(f"invalid {kind} message: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise ProtocolError(
            f"invalid {kind} message: expected a JSON object, got {type(data).__name__}")
    version = data.get("version", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(version)
    if not isinstance(data.get("type"), str):
        raise ProtocolError(f"invalid {kind} message: no `type` field")
    return data


_M = TypeVar("_M")


def validate_frame(adapter: TypeAdapter[_M], frame: bytes, kind: str) -> _M:
    data = parse_envelope(frame, kind)
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise ProtocolError(f"invalid {kind} message: {_describe(exc)}") from None


def join_signing_bytes(nonce: bytes, run_id: str, p2p_address: str) -> bytes:
    return JOIN_DOMAIN + nonce + run_id.encode() + b"\x00" + p2p_address.encode()


def signed_join(identity: Identity, nonce: bytes, run_id: str, p2p_address: str = "",
                *, observe: bool = False, client_version: str = "",
                replay_class: int = 0) -> Join:
    """The Join answering `nonce`, signed by `identity`."""
    signature = identity.sign(join_signing_bytes(nonce, run_id, p2p_address))
    return Join(run_id=run_id, identity=identity.public_key, p2p_address=p2p_address,
                client_version=client_version, signature=signature, observe=observe,
                replay_class=replay_class)
