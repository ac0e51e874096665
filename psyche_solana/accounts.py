"""Decoders of our programs' accounts (layouts: programs/coordinator_layout.h,
programs/authorization_layout.h, programs/treasurer.c).

`decode_coordinator(data)` turns the on-chain coordinator account into the very
`coordinator.CoordinatorState` the Python state machine uses, plus what only the chain
keeps (authorities, join registry, nonce) in a `CoordinatorAccount`. Malformed bytes
raise `AccountDecodeError` naming the problem.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

from pydantic import ValidationError
from solders.pubkey import Pubkey

from coordinator import (
    Bloom,
    Client,
    ClientState,
    CoordinatorState,
    EpochState,
    NodeIdentity,
    Progress,
    Rewards,
    Round,
    RunState,
    Witness,
    WitnessProof,
)
from coordinator.config import (
    CoordinatorConfig,
    LLMConfig,
)
from coordinator.serialization import CHECKPOINT_TAGS, llm_config_from_fields
from coordinator.state import RewardEntry, VerificationReport
from coordinator.verification import MAX_REPORTS

COORDINATOR_MAGIC = b"PSYCOORD"
AUTHORIZATION_MAGIC = b"PSYAUTHZ"
RUN_MAGIC = b"PSYTRRUN"
PARTICIPANT_MAGIC = b"PSYTPART"
INSTANCE_MAGIC = b"PSYCINST"
COORDINATOR_ACCOUNT_SIZE = 107688
AUTHORIZATION_SIZE = 1152
INSTANCE_SIZE = 80
MODEL_REST_MAX = 1024
STRING_MAX = 64

# offsets of coordinator_layout.h (checked there with _Static_assert)
_HEADER = struct.Struct("<8sQQ32s32s32s96sBBBBBBBBQ")          # 0 .. 232 (model_ahead, model_lost)
CONFIG = struct.Struct("<QQQQQQIHHHHHBB")                      # 232 .. 296
CONFIG_FIELDS = ("warmup_time", "cooldown_time", "max_round_train_time", "round_witness_time",
                 "epoch_time", "global_batch_size_warmup_tokens", "total_steps",
                 "init_min_clients", "min_clients", "witness_nodes", "global_batch_size_start",
                 "global_batch_size_end", "verification_percent",
                 "waiting_for_members_extra_time")
_MODEL = struct.Struct("<IIBB2xI64s64s")                        # 296 .. 440, rest .. 1464
_PROGRESS_EPOCH = struct.Struct("<HHIQIIIHHQ")                  # 1464 .. 1504
_ROUND = struct.Struct("<QQIHHI4x")                             # 32-byte round header
_WITNESS = struct.Struct("<QQB7x24Q24Q32s")                     # 440
_CLIENT = struct.Struct("<32sBBHI")                             # 40 (holds_model: v3, class: v4)
_REWARD = struct.Struct("<32sQQ")                               # 48
_REGISTRY = struct.Struct("<32sQH6x")                          # 48 (replay_class: v4)
_REPORT = struct.Struct("<32s32sI32s32sIII")                    # 144
ROUNDS_OFFSET, ROUND_SIZE = 1504, 14112
CLIENTS_OFFSET = ROUNDS_OFFSET + 4 * ROUND_SIZE
EXITED_OFFSET = CLIENTS_OFFSET + 256 * 40
RATES_OFFSET = EXITED_OFFSET + 256 * 40
REWARDS_OFFSET = RATES_OFFSET + 40
REGISTRY_HEADER_OFFSET = REWARDS_OFFSET + 256 * 48
REGISTRY_OFFSET = REGISTRY_HEADER_OFFSET + 16
VERIFICATION_OFFSET = REGISTRY_OFFSET + 256 * _REGISTRY.size   # seed u64 | n u32 | pad u32
REPORTS_OFFSET = VERIFICATION_OFFSET + 16
RUN_ID_OFFSET = 88


class AccountDecodeError(ValueError):
    """The bytes are not a valid account of ours; the message says why."""


@dataclass
class CoordinatorAccount:
    """The on-chain coordinator: the state machine plus what only the chain keeps."""

    version: int
    nonce: int
    main_authority: Pubkey
    join_authority: Pubkey
    run_id: str
    client_version: str
    config_set: bool
    model_set: bool
    next_active: int
    registry: list[tuple[Pubkey, int]]   # (client, active): pending iff active == next_active
    state: CoordinatorState | None       # None until update-config has set config and model
    run_state: RunState = RunState.Uninitialized
    raw_config: dict[str, int] = field(default_factory=dict)
    # each registry entry's replay class, as its last join_run gave it (0 = none)
    replay_classes: dict[Pubkey, int] = field(default_factory=dict)

    @property
    def pending(self) -> list[Pubkey]:
        return [key for key, active in self.registry if active == self.next_active]

    def pending_replay_classes(self) -> dict[NodeIdentity, int]:
        """The pending joiners' replay classes, as `Coordinator.tick` takes them."""
        return {NodeIdentity(bytes(key)): self.replay_classes.get(key, 0) for key in self.pending}

    def earned(self, user: Pubkey) -> int:
        if self.state is None:
            return 0
        key = bytes(user)
        return next((e.earned for e in self.state.rewards.entries if e.id.key == key), 0)


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.rstrip(b"\0").decode()
    except UnicodeDecodeError:
        raise AccountDecodeError(f"{what} is not UTF-8") from None


def _bloom(values: tuple[int, ...]) -> Bloom:
    return Bloom.from_words(list(values[:16]), tuple(values[16:24]))


_E = TypeVar("_E", bound=Enum)


def _enum(kind: type[_E], value: int, what: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        raise AccountDecodeError(f"{what}: unknown value {value}") from None


def _clients(data: bytes, offset: int, count: int) -> list[Client]:
    out = []
    for i in range(count):
        key, state, holds_model, replay_class, exited_height = _CLIENT.unpack_from(
            data, offset + _CLIENT.size * i)
        if holds_model > 1:
            raise AccountDecodeError(f"client holds_model: unknown value {holds_model}")
        out.append(Client(NodeIdentity(key), _enum(ClientState, state, "client state"),
                          exited_height, bool(holds_model), replay_class=replay_class))
    return out


def _model(data: bytes) -> LLMConfig:
    max_seq_len, cold, tag, has_second, rest_len, first, second = _MODEL.unpack_from(data, 296)
    if tag >= len(CHECKPOINT_TAGS) or rest_len > MODEL_REST_MAX:
        raise AccountDecodeError(f"model: checkpoint tag {tag} / length {rest_len} out of range")
    try:
        return llm_config_from_fields(max_seq_len, cold, tag, _text(first, "checkpoint"),
                                      _text(second, "checkpoint") if has_second else None,
                                      data[440:440 + rest_len])
    except ValueError as exc:
        raise AccountDecodeError(f"model: {exc}") from None


def decode_coordinator(data: bytes) -> CoordinatorAccount:
    data = bytes(data)
    if len(data) != COORDINATOR_ACCOUNT_SIZE:
        raise AccountDecodeError(
            f"a coordinator account has {COORDINATOR_ACCOUNT_SIZE} bytes, got {len(data)}")
    (magic, version, nonce, main, join, run_id, client_version, run_state, pending_pause,
     first_round, cold_start, config_set, model_set, model_ahead, model_lost,
     state_start) = _HEADER.unpack_from(data, 0)
    if magic != COORDINATOR_MAGIC:
        raise AccountDecodeError("not an initialized coordinator account (bad magic)")
    config_values = dict(zip(CONFIG_FIELDS, CONFIG.unpack_from(data, 232), strict=True))
    next_active, registry_len = struct.unpack_from("<QI", data, REGISTRY_HEADER_OFFSET)
    registry_entries = [_REGISTRY.unpack_from(data, REGISTRY_OFFSET + _REGISTRY.size * i)
                        for i in range(min(registry_len, 256))]
    registry = [(Pubkey(key), active) for key, active, _class in registry_entries]
    account = CoordinatorAccount(
        version=version, nonce=nonce, main_authority=Pubkey(main), join_authority=Pubkey(join),
        run_id=_text(run_id, "run_id"), client_version=_text(client_version, "client_version"),
        config_set=bool(config_set), model_set=model_set == 3, next_active=next_active,
        registry=registry, state=None,
        run_state=_enum(RunState, run_state, "run_state"),
        raw_config=config_values,
        replay_classes={Pubkey(key): replay_class
                        for key, _active, replay_class in registry_entries})
    if not (config_set and model_set == 3):
        return account
    try:
        config = CoordinatorConfig.model_validate(config_values)
    except ValidationError as exc:
        raise AccountDecodeError(f"config: {exc}") from None
    (epoch, model_resets, step, esdi, head, start_step, last_step, n_clients, n_exited,
     start_ts) = _PROGRESS_EPOCH.unpack_from(data, 1464)
    if head >= 4 or n_clients > 256 or n_exited > 256:
        raise AccountDecodeError("epoch state out of range")
    rounds = []
    for r in range(4):
        base = ROUNDS_OFFSET + r * ROUND_SIZE
        data_index, seed, height, clients_len, tie, n_witnesses = _ROUND.unpack_from(data, base)
        if n_witnesses > 32:
            raise AccountDecodeError(f"round {r}: {n_witnesses} witnesses")
        witnesses = []
        for w in range(n_witnesses):
            values = _WITNESS.unpack_from(data, base + 32 + 440 * w)
            witnesses.append(Witness(WitnessProof(values[0], values[1], bool(values[2])),
                                     _bloom(values[3:27]), _bloom(values[27:51]), values[51]))
        rounds.append(Round(witnesses, data_index, seed, height, clients_len, tie))
    verification_seed, n_reports = struct.unpack_from("<QI", data, VERIFICATION_OFFSET)
    if n_reports > MAX_REPORTS:
        raise AccountDecodeError(f"{n_reports} verification reports")
    reports = []
    for i in range(n_reports):
        fields = _REPORT.unpack_from(data, REPORTS_OFFSET + _REPORT.size * i)
        reports.append(VerificationReport(NodeIdentity(fields[0]), NodeIdentity(fields[1]),
                                          *fields[2:]))
    rates = struct.unpack_from("<QQQQI", data, RATES_OFFSET)
    entries = [RewardEntry(NodeIdentity(key), earned, slashed) for key, earned, slashed in (
        _REWARD.unpack_from(data, REWARDS_OFFSET + 48 * i) for i in range(min(rates[4], 256)))]
    account.state = CoordinatorState(
        run_id=account.run_id, run_state=account.run_state, model=_model(data), config=config,
        progress=Progress(epoch, step, esdi),
        epoch_state=EpochState(rounds, _clients(data, CLIENTS_OFFSET, n_clients),
                               _clients(data, EXITED_OFFSET, n_exited), head, start_step,
                               last_step, start_ts, bool(first_round), bool(cold_start),
                               verification_seed, reports),
        run_state_start_unix_timestamp=state_start, pending_pause=bool(pending_pause),
        client_version=account.client_version, rewards=Rewards(entries, *rates[:4]),
        model_resets=model_resets, model_ahead=bool(model_ahead), model_lost=bool(model_lost))
    return account


@dataclass(frozen=True)
class CoordinatorInstance:
    """A run id's claim (programs/coordinator_layout.h): the one coordinator account of
    that run id."""

    bump: int
    coordinator_account: Pubkey
    run_id: str


def decode_instance(data: bytes) -> CoordinatorInstance:
    data = bytes(data)
    if len(data) != INSTANCE_SIZE or data[:8] != INSTANCE_MAGIC:
        raise AccountDecodeError("not a coordinator instance (run id claim) account")
    bump, coordinator, run_id = struct.unpack_from("<B7x32s32s", data, 8)
    return CoordinatorInstance(bump, Pubkey(coordinator), _text(run_id, "run_id"))


@dataclass(frozen=True)
class Authorization:
    bump: int
    active: bool
    grantor: Pubkey
    grantee: Pubkey
    scope: bytes
    grantor_update_unix_timestamp: int
    delegates: list[Pubkey]

    def is_valid_for(self, user: Pubkey) -> bool:
        return self.active and (self.grantee == Pubkey.default() or self.grantee == user
                                or user in self.delegates)


def decode_authorization(data: bytes) -> Authorization:
    data = bytes(data)
    if len(data) != AUTHORIZATION_SIZE or data[:8] != AUTHORIZATION_MAGIC:
        raise AccountDecodeError("not an authorization account")
    bump, active, n, grantor, grantee, scope_len, scope, ts = struct.unpack_from(
        "<BB2xI32s32sI4x32sq", data, 8)
    delegates = [Pubkey(data[128 + 32 * i:160 + 32 * i]) for i in range(min(n, 32))]
    return Authorization(bump, bool(active), Pubkey(grantor), Pubkey(grantee),
                         scope[:scope_len], ts, delegates)


@dataclass(frozen=True)
class TreasurerRun:
    bump: int
    index: int
    main_authority: Pubkey
    join_authority: Pubkey
    coordinator_account: Pubkey
    collateral_mint: Pubkey
    total_claimed_collateral_amount: int
    total_claimed_earned_points: int


def decode_treasurer_run(data: bytes) -> TreasurerRun:
    data = bytes(data)
    if len(data) != 168 or data[:8] != RUN_MAGIC:
        raise AccountDecodeError("not a treasurer run account")
    bump, index, main, join, coordinator, mint, claimed_amount, claimed_points = (
        struct.unpack_from("<B7xQ32s32s32s32sQQ", data, 8))
    return TreasurerRun(bump, index, Pubkey(main), Pubkey(join), Pubkey(coordinator),
                        Pubkey(mint), claimed_amount, claimed_points)


@dataclass(frozen=True)
class Participant:
    claimed_collateral_amount: int
    claimed_earned_points: int


def decode_participant(data: bytes) -> Participant:
    data = bytes(data)
    if len(data) != 32 or data[:8] != PARTICIPANT_MAGIC:
        raise AccountDecodeError("not a treasurer participant account")
    return Participant(*struct.unpack_from("<QQ", data, 16))
