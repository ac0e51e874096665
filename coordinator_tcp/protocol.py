"""The TCP backend's wire protocol: versioned pydantic messages in length-prefixed frames.

One connection = one client identity:

    server -> client   Challenge{nonce}
    client -> server   Join{run_id, identity, p2p_address, client_version,
                            signature = Ed25519(identity, JOIN_DOMAIN || nonce || run_id || p2p_address)}
    server -> client   Welcome | ErrorReply(fatal) and close
    then               client: WarmupWitness | WitnessSubmit | HealthCheck | CheckpointReport | Withdraw
                       server: StateUpdate (on every change) | Heartbeat | ErrorReply

`Join.observe = true` opens a read-only connection (the testnet's watcher, dashboards,
benchmarks): it is authenticated the same way and receives every StateUpdate, but its
key is never offered to the coordinator as a pending client and any event it sends is
rejected. The data server (`data_protocol`) reuses Challenge/Join for its handshake.

Messages after `Join` carry no sender field: the server attributes them to the key that
signed the challenge, so a client can only ever speak for itself. Every message is a
JSON object with `type` and `version`; anything else is rejected with an error naming
what is wrong.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

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

from coordinator import Bloom, Committee, CommitteeProof, NodeIdentity, Witness, WitnessProof
from coordinator.config import GcsCheckpoint, HubCheckpoint
from coordinator.limits import BLOOM_KEYS, BLOOM_WORDS

PROTOCOL_VERSION = 1
JOIN_DOMAIN = b"psyche-tcp-join/1"
U64 = Annotated[int, Field(ge=0, lt=2**64)]


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


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: Literal[1] = 1  # PROTOCOL_VERSION


# ------------------------------------------------------------------ shared payload models
class BloomModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    words: list[U64] = Field(min_length=BLOOM_WORDS, max_length=BLOOM_WORDS)
    keys: list[U64] = Field(min_length=BLOOM_KEYS, max_length=BLOOM_KEYS)

    @classmethod
    def of(cls, bloom: Bloom) -> BloomModel:
        return cls(words=bloom.words, keys=list(bloom.keys))

    def to_bloom(self) -> Bloom:
        return Bloom.from_words(list(self.words), tuple(self.keys))


class WitnessModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    position: U64
    index: U64
    witness: bool
    participant_bloom: BloomModel
    broadcast_bloom: BloomModel
    broadcast_merkle: Bytes32

    @classmethod
    def of(cls, w: Witness) -> WitnessModel:
        return cls(position=w.proof.position, index=w.proof.index, witness=w.proof.witness,
                   participant_bloom=BloomModel.of(w.participant_bloom),
                   broadcast_bloom=BloomModel.of(w.broadcast_bloom),
                   broadcast_merkle=w.broadcast_merkle)

    def to_witness(self) -> Witness:
        return Witness(proof=WitnessProof(self.position, self.index, self.witness),
                       participant_bloom=self.participant_bloom.to_bloom(),
                       broadcast_bloom=self.broadcast_bloom.to_bloom(),
                       broadcast_merkle=self.broadcast_merkle)


class WitnessMetadata(BaseModel):
    """Carried for observability (Psyche ignores it on-chain too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    step: int = 0
    loss: float | None = None
    tokens_per_sec: float = 0.0
    bandwidth_per_sec: float = 0.0


class HealthCheckEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node: Bytes32
    committee: Literal["Trainer", "Verifier", "TieBreaker"]
    position: U64
    index: U64

    def to_pair(self) -> tuple[NodeIdentity, CommitteeProof]:
        return NodeIdentity(self.node), CommitteeProof(
            Committee[self.committee], self.position, self.index)


# ------------------------------------------------------------------ server -> client
class Challenge(_Message):
    type: Literal["challenge"] = "challenge"
    nonce: Bytes32


class Welcome(_Message):
    type: Literal["welcome"] = "welcome"
    identity: Bytes32


class StateUpdate(_Message):
    """The whole coordinator state (`coordinator.encode_state`, base64) and the p2p
    addresses the server learned at join time, keyed by hex identity."""

    type: Literal["state"] = "state"
    state: str
    p2p_addresses: dict[str, str] = Field(default_factory=dict)
    server_time: int = 0
    # Unix time (float seconds) at which the server encoded this broadcast: latency probes.
    sent_at: float = 0.0

    @property
    def state_bytes(self) -> bytes:
        return base64.b64decode(self.state)


class Heartbeat(_Message):
    type: Literal["heartbeat"] = "heartbeat"
    server_time: int


class ErrorReply(_Message):
    type: Literal["error"] = "error"
    error: str
    detail: str = ""
    fatal: bool = False


# ------------------------------------------------------------------ client -> server
class Join(_Message):
    type: Literal["join"] = "join"
    run_id: str = Field(max_length=32)
    identity: Bytes32
    p2p_address: str = Field(max_length=1024)
    client_version: str = Field(default="", max_length=96)
    signature: Bytes64
    observe: bool = False

    @field_validator("run_id")
    @classmethod
    def _run_id_bytes(cls, value: str) -> str:
        if len(value.encode()) > 32:
            raise ValueError("run_id is at most 32 bytes")
        return value


class WarmupWitness(_Message):
    type: Literal["warmup_witness"] = "warmup_witness"
    witness: WitnessModel


class WitnessSubmit(_Message):
    type: Literal["witness"] = "witness"
    witness: WitnessModel
    metadata: WitnessMetadata = Field(default_factory=WitnessMetadata)


class HealthCheck(_Message):
    type: Literal["health_check"] = "health_check"
    checks: list[HealthCheckEntry] = Field(min_length=1, max_length=256)


class CheckpointReport(_Message):
    type: Literal["checkpoint"] = "checkpoint"
    index: U64
    hub: HubCheckpoint | None = None
    gcs: GcsCheckpoint | None = None


class Withdraw(_Message):
    type: Literal["withdraw"] = "withdraw"


ServerMessage = Annotated[
    Challenge | Welcome | StateUpdate | Heartbeat | ErrorReply, Field(discriminator="type")
]
ClientMessage = Annotated[
    Join | WarmupWitness | WitnessSubmit | HealthCheck | CheckpointReport | Withdraw,
    Field(discriminator="type"),
]
_SERVER = TypeAdapter(ServerMessage)
_CLIENT = TypeAdapter(ClientMessage)


# Refusals of a join that retrying cannot fix: clients stop instead of reconnecting.
PERMANENT_JOIN_ERRORS = frozenset({"WrongRunId", "BadSignature"})


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol version."""


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
    if not isinstance(data, dict):
        raise ProtocolError(
            f"invalid {kind} message: expected a JSON object, got {type(data).__name__}")
    version = data.get("version", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"unsupported protocol version {version!r}: this side speaks {PROTOCOL_VERSION}")
    if not isinstance(data.get("type"), str):
        raise ProtocolError(f"invalid {kind} message: no `type` field")
    return data


def validate_frame(adapter: TypeAdapter[Any], frame: bytes, kind: str) -> Any:
    data = parse_envelope(frame, kind)
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise ProtocolError(f"invalid {kind} message: {_describe(exc)}") from None


def decode_client_message(
    frame: bytes,
) -> Join | WarmupWitness | WitnessSubmit | HealthCheck | CheckpointReport | Withdraw:
    return validate_frame(_CLIENT, frame, "client")  # type: ignore[no-any-return]


def decode_server_message(
    frame: bytes,
) -> Challenge | Welcome | StateUpdate | Heartbeat | ErrorReply:
    return validate_frame(_SERVER, frame, "server")  # type: ignore[no-any-return]


def join_signing_bytes(nonce: bytes, run_id: str, p2p_address: str) -> bytes:
    return JOIN_DOMAIN + nonce + run_id.encode() + b"\x00" + p2p_address.encode()
