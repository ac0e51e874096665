"""Versioned binary form of the whole `CoordinatorState` (persistence and broadcast).

Little-endian, no padding, fields in the on-chain repr(C) order (docs/coordinator.md,
"State layout"). Lists are a count followed by their entries (compact, unlike the fixed
on-chain arrays).

    header      magic "PSYC" | version u16 (= 5)
    run_id      [32] UTF-8, zero padded
    run_state   u8
    model       max_seq_len u32 | cold_start_warmup_steps u32
                checkpoint: tag u8 (0 Dummy, 1 Hub, 2 P2P, 3 Gcs, 4 P2PGcs)
                            | repo_id-or-bucket [64] | has_second u8 | revision-or-prefix [64]
                rest: len u32 | UTF-8 JSON {architecture, data_type, data_location,
                                            lr_schedule, optimizer} in the TOML shape
    config      warmup_time u64 | cooldown_time u64 | max_round_train_time u64
                | round_witness_time u64 | epoch_time u64 | total_steps u32
                | init_min_clients u16 | min_clients u16 | witness_nodes u16
                | global_batch_size_start u16 | global_batch_size_end u16
                | global_batch_size_warmup_tokens u64 | verification_percent u8
                | waiting_for_members_extra_time u8
    progress    epoch u16 | step u32 | epoch_start_data_index u64
    epoch_state rounds[4] each: n u8 | n x witness | data_index u64 | random_seed u64
                            | height u32 | clients_len u16 | tie_breaker_tasks u16
                clients: n u16 | n x client ; exited_clients: n u16 | n x client
                rounds_head u32 | start_step u32 | last_step u32 | start_timestamp u64
                | first_round u8 | cold_start_epoch u8
    run_state_start_unix_timestamp u64 | pending_pause u8
    client_version [96] UTF-8, zero padded
    rewards     current earning u64 | current slashing u64 | future earning u64
                | future slashing u64 | n u16 | n x (key [32] | earned u64 | slashed u64)
    verification (version 2; absent in 1)
                epoch_state.verification_seed u64 | n u8 | n x report
    model_resets u16 | model_ahead u8 (version 3; absent before: 0, False)
    model_lost u8 (version 4; absent before: False)
    report  = reporter [32] | accused [32] | step u32 | published_hash [32]
              | expected_hash [32] | jaccard_ppm u32 | hamming_ppm u32 | manhattan_ppm u32

    client  = key [32] | state u8 | exited_height u32 | holds_model u8 (version 3; absent
              before: False) | replay_class u16 (version 5; absent before: 0)
    witness = position u64 | index u64 | witness u8 | participant bloom | broadcast bloom
              | broadcast_merkle [32];   bloom = 16 x u64 words | 8 x u64 keys
"""

from __future__ import annotations

import json
import struct
from enum import IntEnum
from typing import Any, TypeVar

from pydantic import ValidationError

from coordinator.bloom import Bloom
from coordinator.committee import WitnessProof
from coordinator.config import (
    Checkpoint,
    CoordinatorConfig,
    DummyCheckpoint,
    GcsCheckpoint,
    HubCheckpoint,
    LLMConfig,
    P2PCheckpoint,
    P2PGcsCheckpoint,
    coordinator_config_errors,
)
from coordinator.limits import (
    BLOOM_KEYS,
    BLOOM_WORDS,
    CLIENT_VERSION_MAX_BYTES,
    MAX_CLIENTS,
    MAX_WITNESSES,
    NUM_STORED_ROUNDS,
    RUN_ID_MAX_BYTES,
    STRING_MAX_BYTES,
    ClientState,
    RunState,
)
from coordinator.state import (
    Client,
    CoordinatorState,
    EpochState,
    NodeIdentity,
    Progress,
    RewardEntry,
    Rewards,
    Round,
    VerificationReport,
    Witness,
)
from coordinator.verification import MAX_REPORTS

MAGIC = b"PSYC"
VERSION = 5  # 2 appended the verification section, 3 a client's holds_model, 4 model_lost,
# 5 a client's replay_class; 1 to 4 decode
VERSIONS = (1, 2, 3, 4, VERSION)
# The checkpoint variant's tag in this layout and in the on-chain account. Typed as plain
# `type` so that callers can look up `type(x)` of any object (psyche_solana does).
CHECKPOINT_TAGS: list[type] = [
    DummyCheckpoint, HubCheckpoint, P2PCheckpoint, GcsCheckpoint, P2PGcsCheckpoint]
_CONFIG = struct.Struct("<QQQQQIHHHHHQBB")
_CONFIG_FIELDS = ("warmup_time", "cooldown_time", "max_round_train_time", "round_witness_time",
                  "epoch_time", "total_steps", "init_min_clients", "min_clients", "witness_nodes",
                  "global_batch_size_start", "global_batch_size_end",
                  "global_batch_size_warmup_tokens", "verification_percent",
                  "waiting_for_members_extra_time")
_BLOOM = struct.Struct(f"<{BLOOM_WORDS + BLOOM_KEYS}Q")
_PROOF = struct.Struct("<QQB")
_CLIENT_V2 = struct.Struct("<32sBI")
_CLIENT_V4 = struct.Struct("<32sBIB")
_CLIENT = struct.Struct("<32sBIBH")
U16_MAX = 2**16 - 1
_ROUND_TAIL = struct.Struct("<QQIHH")
_EPOCH_TAIL = struct.Struct("<IIIQBB")
_REWARD = struct.Struct("<32sQQ")
_REPORT = struct.Struct("<32s32sI32s32sIII")

E = TypeVar("E", bound=IntEnum)


class StateDecodeError(ValueError):
    """The bytes are not a valid serialized coordinator state; the message says why."""


def _fixed(text: str, size: int) -> bytes:
    raw = text.encode()
    if len(raw) > size:
        raise ValueError(f"{text!r} is longer than {size} bytes")
    return raw.ljust(size, b"\0")


def _bloom(bloom: Bloom) -> bytes:
    return _BLOOM.pack(*bloom.words, *bloom.keys)


def _client(client: Client, version: int) -> bytes:
    if version < 3:
        return _CLIENT_V2.pack(client.id.key, int(client.state), client.exited_height)
    if version < 5:
        return _CLIENT_V4.pack(client.id.key, int(client.state), client.exited_height,
                               int(client.holds_model))
    if not 0 <= client.replay_class <= U16_MAX:
        raise ValueError(f"client {client.id!r}: replay_class {client.replay_class} is not a u16")
    return _CLIENT.pack(client.id.key, int(client.state), client.exited_height,
                        int(client.holds_model), client.replay_class)


def encode_state(state: CoordinatorState, version: int = VERSION) -> bytes:
    """`version`: an older layout (what a peer of an older build reads; the tests of
    decoding them), dropping what it cannot carry."""
    if version not in VERSIONS:
        raise ValueError(f"no state encoding version {version}")
    out = [MAGIC, struct.pack("<H", version), _fixed(state.run_id, RUN_ID_MAX_BYTES),
           struct.pack("<B", int(state.run_state))]
    model = state.model
    checkpoint = model.checkpoint
    if isinstance(checkpoint, GcsCheckpoint | P2PGcsCheckpoint):
        first, second = checkpoint.bucket, checkpoint.prefix
    else:
        first, second = checkpoint.repo_id, checkpoint.revision
    rest = model.model_dump(mode="json", include={"architecture", "data_type", "data_location",
                                                  "lr_schedule", "optimizer"})
    rest_bytes = json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()
    out += [struct.pack("<IIB", model.max_seq_len, model.cold_start_warmup_steps,
                        CHECKPOINT_TAGS.index(type(checkpoint))),
            _fixed(first, STRING_MAX_BYTES), struct.pack("<B", second is not None),
            _fixed(second or "", STRING_MAX_BYTES), struct.pack("<I", len(rest_bytes)), rest_bytes]
    out.append(_CONFIG.pack(*(getattr(state.config, name) for name in _CONFIG_FIELDS)))
    progress = state.progress
    out.append(struct.pack("<HIQ", progress.epoch, progress.step, progress.epoch_start_data_index))
    epoch = state.epoch_state
    for round_ in epoch.rounds:
        out.append(struct.pack("<B", len(round_.witnesses)))
        for witness in round_.witnesses:
            proof = witness.proof
            out += [_PROOF.pack(proof.position, proof.index, proof.witness),
                    _bloom(witness.participant_bloom), _bloom(witness.broadcast_bloom),
                    witness.broadcast_merkle]
        out.append(_ROUND_TAIL.pack(round_.data_index, round_.random_seed, round_.height,
                                    round_.clients_len, round_.tie_breaker_tasks))
    for clients in (epoch.clients, epoch.exited_clients):
        out.append(struct.pack("<H", len(clients)))
        out += [_client(client, version) for client in clients]
    out.append(_EPOCH_TAIL.pack(epoch.rounds_head, epoch.start_step, epoch.last_step,
                                epoch.start_timestamp, epoch.first_round, epoch.cold_start_epoch))
    out.append(struct.pack("<QB", state.run_state_start_unix_timestamp, state.pending_pause))
    out.append(_fixed(state.client_version, CLIENT_VERSION_MAX_BYTES))
    rewards = state.rewards
    out.append(struct.pack("<QQQQH", rewards.current_earning_rate_total_shared,
                           rewards.current_slashing_rate_per_client,
                           rewards.future_earning_rate_total_shared,
                           rewards.future_slashing_rate_per_client, len(rewards.entries)))
    out += [_REWARD.pack(e.id.key, e.earned, e.slashed) for e in rewards.entries]
    if version < 2:
        return b"".join(out)
    out.append(struct.pack("<QB", epoch.verification_seed, len(epoch.reports)))
    out += [_REPORT.pack(r.reporter.key, r.accused.key, r.step, r.published_hash,
                         r.expected_hash, r.jaccard_ppm, r.hamming_ppm, r.manhattan_ppm)
            for r in epoch.reports]
    if version >= 3:
        out.append(struct.pack("<HB", state.model_resets, state.model_ahead))
    if version >= 4:
        out.append(struct.pack("<B", state.model_lost))
    return b"".join(out)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.offset = data, 0

    def take(self, size: int, what: str) -> bytes:
        end = self.offset + size
        if end > len(self.data):
            raise StateDecodeError(f"truncated at byte {self.offset} while reading {what}")
        chunk = self.data[self.offset:end]
        self.offset = end
        return chunk

    def unpack(self, layout: struct.Struct | str, what: str) -> tuple[Any, ...]:
        layout = struct.Struct(layout) if isinstance(layout, str) else layout
        return layout.unpack(self.take(layout.size, what))

    def text(self, size: int, what: str) -> str:
        try:
            return self.take(size, what).rstrip(b"\0").decode()
        except UnicodeDecodeError:
            raise StateDecodeError(f"{what} is not UTF-8") from None

    def count(self, layout: str, limit: int, what: str) -> int:
        (n,) = self.unpack(layout, what)
        if n > limit:
            raise StateDecodeError(f"{what}: {n} entries, at most {limit}")
        return int(n)


def _enum(kind: type[E], value: int, what: str) -> E:
    try:
        return kind(value)
    except ValueError:
        raise StateDecodeError(f"{what}: unknown value {value}") from None


def _read_bloom(reader: _Reader, what: str) -> Bloom:
    values = reader.unpack(_BLOOM, what)
    return Bloom.from_words(list(values[:BLOOM_WORDS]), tuple(values[BLOOM_WORDS:]))


def _read_client(reader: _Reader, version: int) -> Client:
    holds_model = replay_class = 0
    if version < 3:
        key, state, exited_height = reader.unpack(_CLIENT_V2, "client")
    elif version < 5:
        key, state, exited_height, holds_model = reader.unpack(_CLIENT_V4, "client")
    else:
        key, state, exited_height, holds_model, replay_class = reader.unpack(_CLIENT, "client")
    if holds_model > 1:
        raise StateDecodeError(f"client holds_model {holds_model} is not 0 or 1")
    return Client(NodeIdentity(key), _enum(ClientState, state, "client state"), exited_height,
                  bool(holds_model), replay_class)


def _read_model(reader: _Reader) -> LLMConfig:
    max_seq_len, cold_start, tag = reader.unpack("<IIB", "model")
    first = reader.text(STRING_MAX_BYTES, "checkpoint")
    (has_second,) = reader.unpack("<B", "checkpoint")
    second = reader.text(STRING_MAX_BYTES, "checkpoint") if has_second else None
    reader.take(0 if has_second else STRING_MAX_BYTES, "checkpoint")
    (size,) = reader.unpack("<I", "model")
    try:
        return llm_config_from_fields(max_seq_len, cold_start, tag, first, second,
                                      reader.take(size, "model"))
    except ValueError as exc:
        raise StateDecodeError(f"model: {exc}") from None


def llm_config_from_fields(max_seq_len: int, cold_start_warmup_steps: int, checkpoint_tag: int,
                           first: str, second: str | None, rest_json: bytes) -> LLMConfig:
    """The model config from its binary fields (this layout and the on-chain account's):
    the checkpoint as tag + (repo_id | bucket) + (revision | prefix), the rest as JSON.
    Raises ValueError (pydantic's ValidationError is one) naming what is wrong."""
    if not 0 <= checkpoint_tag < len(CHECKPOINT_TAGS):
        raise ValueError(f"unknown checkpoint tag {checkpoint_tag}")
    rest = json.loads(rest_json.decode())
    if not isinstance(rest, dict):
        raise ValueError("the model's JSON part is not an object")
    cls: type[Checkpoint] = CHECKPOINT_TAGS[checkpoint_tag]
    names = ("bucket", "prefix") if cls in (GcsCheckpoint, P2PGcsCheckpoint) else (
        "repo_id", "revision")
    checkpoint = cls.model_validate({names[0]: first, names[1]: second})
    return LLMConfig.model_validate({**rest, "max_seq_len": max_seq_len,
                                     "cold_start_warmup_steps": cold_start_warmup_steps,
                                     "checkpoint": checkpoint})


def decode_state(data: bytes) -> CoordinatorState:
    """Inverse of `encode_state`; raises StateDecodeError on any malformed input."""
    reader = _Reader(bytes(data))
    if reader.take(4, "magic") != MAGIC:
        raise StateDecodeError("not a coordinator state (bad magic)")
    (version,) = reader.unpack("<H", "version")
    if version not in VERSIONS:
        raise StateDecodeError(f"unsupported version {version} (this build reads {VERSION})")
    run_id = reader.text(RUN_ID_MAX_BYTES, "run_id")
    run_state = _enum(RunState, reader.unpack("<B", "run_state")[0], "run_state")
    model = _read_model(reader)
    values = dict(zip(_CONFIG_FIELDS, reader.unpack(_CONFIG, "config"), strict=True))
    try:
        config = CoordinatorConfig.model_validate(values)
    except ValidationError as exc:
        raise StateDecodeError(f"config: {exc}") from None
    problems = coordinator_config_errors(config)
    if problems:
        raise StateDecodeError("; ".join(problems))
    progress = Progress(*reader.unpack("<HIQ", "progress"))
    rounds = []
    for _ in range(NUM_STORED_ROUNDS):
        witnesses = []
        for _ in range(reader.count("<B", MAX_WITNESSES, "round witnesses")):
            position, index, is_witness = reader.unpack(_PROOF, "witness proof")
            witnesses.append(Witness(
                WitnessProof(position, index, bool(is_witness)),
                _read_bloom(reader, "participant bloom"), _read_bloom(reader, "broadcast bloom"),
                reader.take(32, "broadcast merkle")))
        rounds.append(Round(witnesses, *reader.unpack(_ROUND_TAIL, "round")))
    clients = [_read_client(reader, version)
               for _ in range(reader.count("<H", MAX_CLIENTS, "clients"))]
    exited = [_read_client(reader, version)
              for _ in range(reader.count("<H", MAX_CLIENTS, "exited clients"))]
    head, start_step, last_step, start_ts, first_round, cold = reader.unpack(_EPOCH_TAIL, "epoch")
    if head >= NUM_STORED_ROUNDS:
        raise StateDecodeError(f"rounds_head {head} out of range")
    epoch = EpochState(rounds, clients, exited, head, start_step, last_step, start_ts,
                       bool(first_round), bool(cold))
    state_start, pending_pause = reader.unpack("<QB", "run state start")
    client_version = reader.text(CLIENT_VERSION_MAX_BYTES, "client_version")
    rates = reader.unpack("<QQQQ", "rewards")
    entries = [RewardEntry(NodeIdentity(key), earned, slashed) for key, earned, slashed in (
        reader.unpack(_REWARD, "reward") for _ in range(reader.count("<H", MAX_CLIENTS, "rewards")))]
    if version >= 2:
        (epoch.verification_seed,) = reader.unpack("<Q", "verification seed")
        for _ in range(reader.count("<B", MAX_REPORTS, "verification reports")):
            fields = reader.unpack(_REPORT, "verification report")
            epoch.reports.append(VerificationReport(
                NodeIdentity(fields[0]), NodeIdentity(fields[1]), *fields[2:]))
    model_resets, model_ahead = reader.unpack("<HB", "model resets") if version >= 3 else (0, 0)
    if model_ahead > 1:
        raise StateDecodeError(f"model_ahead {model_ahead} is not 0 or 1")
    (model_lost,) = reader.unpack("<B", "model lost") if version >= 4 else (0,)
    if model_lost > 1:
        raise StateDecodeError(f"model_lost {model_lost} is not 0 or 1")
    if reader.offset != len(reader.data):
        raise StateDecodeError(f"{len(reader.data) - reader.offset} trailing bytes")
    return CoordinatorState(
        run_id=run_id, run_state=run_state, model=model, config=config, progress=progress,
        epoch_state=epoch, run_state_start_unix_timestamp=state_start,
        pending_pause=bool(pending_pause), client_version=client_version,
        rewards=Rewards(entries, *rates), model_resets=model_resets,
        model_ahead=bool(model_ahead), model_lost=bool(model_lost))
