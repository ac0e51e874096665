"""The TCP backend's wire protocol: versioned pydantic messages in length-prefixed frames.

One connection = one client identity:

    server -> client   Challenge{nonce}
    client -> server   Join{run_id, identity, p2p_address, client_version,
                            signature = Ed25519(identity, JOIN_DOMAIN || nonce || run_id || p2p_address)}
    server -> client   Welcome | ErrorReply(fatal) and close
    then               client: WarmupWitness | WitnessSubmit | HealthCheck | CheckpointReport | Withdraw
                               | VerificationReportMessage | ResyncAddresses
                       server: StateUpdate (on every change) | Heartbeat | ErrorReply | Notice

A StateUpdate carries the whole p2p address map only in a connection's first state (and
in the answer to `ResyncAddresses`); every other carries the changes since the previous
one, numbered so that a receiver that missed one finds out (`coordinator_tcp.addresses`).
A client left out of the epoch (it is full, or it started before the client came) is
told so, and what it waits for, in a `Notice`.

The handshake messages and the envelope are `psyche_common.tcp.messages` (the data
server speaks them too); they are re-exported here as part of this protocol.

`Join.observe = true` opens a read-only connection (the testnet's watcher, dashboards,
benchmarks): it is authenticated the same way and receives every StateUpdate, but its
key is never offered to the coordinator as a pending client and any event it sends is
rejected. An observer's StateUpdate also says how many clients are connected and asking
to take part (`joined`), and comes again whenever that number changes. The data server (`data_protocol`) reuses Challenge/Join for its handshake.

Messages after `Join` carry no sender field: the server attributes them to the key that
signed the challenge, so a client can only ever speak for itself. Every message is a
JSON object with `type` and `version`; anything else is rejected with an error naming
what is wrong.
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from coordinator import Bloom, Committee, CommitteeProof, NodeIdentity, Witness, WitnessProof
from coordinator.config import GcsCheckpoint, HubCheckpoint
from coordinator.limits import BLOOM_KEYS, BLOOM_WORDS
from coordinator.messages import MAX_WITNESS_EVALS, witness_eval_scores
from coordinator.state import VerificationReport
from psyche_common.tcp.messages import (
    JOIN_DOMAIN,
    PERMANENT_JOIN_ERRORS,
    PROTOCOL_VERSION,
    Bytes32,
    Challenge,
    ErrorReply,
    Heartbeat,
    Join,
    ProtocolError,
    VersionMismatch,
    Welcome,
    encode,
    join_signing_bytes,
    parse_envelope,
    signed_join,
    validate_frame,
)
from psyche_common.tcp.messages import Message as _Message

U64 = Annotated[int, Field(ge=0, lt=2**64)]


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


class WitnessEval(BaseModel):
    """One eval score in a witness's metadata (Psyche's WitnessEvalResult: a name of at
    most 32 bytes and a value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(max_length=32)
    value: float




class WitnessMetadata(BaseModel):
    """Carried for observability (Psyche ignores it on-chain too): the witness's last
    loss and speed, and its latest eval scores (`evals`, at most 8)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    step: int = 0
    loss: float | None = None
    tokens_per_sec: float = 0.0
    bandwidth_per_sec: float = 0.0
    evals: list[WitnessEval] = Field(default_factory=list, max_length=MAX_WITNESS_EVALS)

    @classmethod
    def evals_of(cls, scores: dict[str, dict[str, float]]) -> list[WitnessEval]:
        """`coordinator.messages.witness_eval_scores` of `scores`, as wire models."""
        return [WitnessEval(name=score.name, value=score.value)
                for score in witness_eval_scores(scores)]


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
class StateUpdate(_Message):
    """The coordinator state (`coordinator.encode_state`) and the p2p addresses the
    server learned at join time, keyed by hex identity.

    The state comes whole (`state`, base64) in a connection's first update, after it
    asks (`ResyncAddresses`) and to observers; otherwise as `state_delta`, a base64
    bsdiff4 patch from the state numbered `state_seq - 1` to the one numbered
    `state_seq`, whose SHA-256 starts with `state_digest`
    (`coordinator_tcp.state_delta.StateMirror` applies them). The addresses: the whole
    map when `addresses_full`, else the entries added or changed since the previous
    StateUpdate and the keys removed (`p2p_removed`). `addresses_seq` numbers the map
    this message leads to: one more than the previous one's when it changes anything,
    the same when it does not (`coordinator_tcp.addresses.AddressMirror` applies them)."""

    type: Literal["state"] = "state"
    state: str = ""
    state_seq: int = Field(default=0, ge=0)
    state_delta: str = ""
    state_digest: str = Field(default="", max_length=64)
    p2p_addresses: dict[str, str] = Field(default_factory=dict)
    p2p_removed: list[str] = Field(default_factory=list)
    addresses_seq: int = Field(default=0, ge=0)
    addresses_full: bool = False
    server_time: int = 0
    # Unix time (float seconds) at which the server encoded this broadcast: latency probes.
    sent_at: float = 0.0
    # Observers only: the clients connected and asking to take part (what the next tick
    # is given; the coordinator state lists none until the warm-up). Clients' updates
    # leave it out (`to_frame`), so a client of an earlier version still reads them.
    joined: int | None = Field(default=None, ge=0)

    def to_frame(self) -> bytes:
        """The message's bytes, without the fields that are not set (None) and without
        empty address changes."""
        empty = {name for name in ("p2p_addresses", "p2p_removed", "state", "state_delta",
                                   "state_digest") if not getattr(self, name)}
        return self.model_dump_json(exclude_none=True, exclude=empty).encode()

    @property
    def state_bytes(self) -> bytes:
        return base64.b64decode(self.state)


NoticeCode = Literal["epoch_full", "epoch_started", "taking_part", "replay_class"]


class Notice(_Message):
    """To one client, when what it waits for changes: it is left out of the epoch
    (`epoch_full`: the epoch holds its `cap` clients; `epoch_started`: it joined after
    the epoch began; `replay_class`: a verified run waits for more joiners of its replay
    class) and waits for the next one, or it is taking part again. `text` is the sentence
    its log shows."""

    type: Literal["notice"] = "notice"
    code: NoticeCode
    text: str = Field(max_length=512)
    cap: int = Field(default=0, ge=0)


# ------------------------------------------------------------------ client -> server
class ResyncAddresses(_Message):
    """The StateUpdates did not follow each other (a change was missed): send the whole
    p2p address map again (answered with a StateUpdate whose `addresses_full` is set)."""

    type: Literal["resync"] = "resync"


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


U32 = Annotated[int, Field(ge=0, lt=2**32)]


class VerificationReportMessage(_Message):
    """A follower's replay did not reproduce `accused`'s result of `step`
    (coordinator/verification.py). The reporter is the connection's key: the server
    attributes it to the key that signed the challenge, as every message after Join."""

    type: Literal["verification_report"] = "verification_report"
    accused: Bytes32
    step: U32
    published_hash: Bytes32
    expected_hash: Bytes32
    jaccard_ppm: U32
    hamming_ppm: U32
    manhattan_ppm: U32

    def to_report(self, reporter: NodeIdentity) -> VerificationReport:
        return VerificationReport(
            reporter=reporter, accused=NodeIdentity(self.accused), step=self.step,
            published_hash=self.published_hash, expected_hash=self.expected_hash,
            jaccard_ppm=self.jaccard_ppm, hamming_ppm=self.hamming_ppm,
            manhattan_ppm=self.manhattan_ppm)


ServerMessage = Annotated[
    Challenge | Welcome | StateUpdate | Heartbeat | ErrorReply | Notice,
    Field(discriminator="type"),
]
ClientMessage = Annotated[
    Join | WarmupWitness | WitnessSubmit | HealthCheck | CheckpointReport | Withdraw
    | VerificationReportMessage | ResyncAddresses,
    Field(discriminator="type"),
]
_SERVER: TypeAdapter[Challenge | Welcome | StateUpdate | Heartbeat | ErrorReply | Notice] = (
    TypeAdapter(ServerMessage))
_CLIENT: TypeAdapter[
    Join | WarmupWitness | WitnessSubmit | HealthCheck | CheckpointReport | Withdraw
    | VerificationReportMessage | ResyncAddresses
] = TypeAdapter(ClientMessage)


def decode_client_message(
    frame: bytes,
) -> (Join | WarmupWitness | WitnessSubmit | HealthCheck | CheckpointReport | Withdraw
      | VerificationReportMessage | ResyncAddresses):
    return validate_frame(_CLIENT, frame, "client")


def decode_server_message(
    frame: bytes,
) -> Challenge | Welcome | StateUpdate | Heartbeat | ErrorReply | Notice:
    return validate_frame(_SERVER, frame, "server")


__all__ = [
    "JOIN_DOMAIN", "PERMANENT_JOIN_ERRORS", "PROTOCOL_VERSION", "U64", "BloomModel", "Bytes32",
    "Challenge", "CheckpointReport", "ClientMessage", "ErrorReply", "HealthCheck",
    "HealthCheckEntry", "Heartbeat", "Join", "Notice", "NoticeCode", "ProtocolError",
    "ResyncAddresses", "ServerMessage", "StateUpdate",
    "VerificationReportMessage", "VersionMismatch", "WarmupWitness", "Welcome", "Withdraw", "WitnessEval", "WitnessMetadata", "WitnessModel", "WitnessSubmit",
    "decode_client_message", "decode_server_message", "encode", "join_signing_bytes",
    "parse_envelope", "signed_join", "validate_frame",
]
