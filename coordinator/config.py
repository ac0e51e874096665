"""Run configuration: Psyche's `state.toml` (coordinator + model) and `data.toml`.

`parse_state_toml(text)` / `load_state_file(path)` return a `StateFile` or raise
`ConfigError` whose `errors` list names every problem found, each as
`dotted.key: rule`, e.g. `config.init_min_clients: must be >= config.min_clients (2), got 1`.
Checks run in two layers so that all problems come out at once: pydantic checks
types, ranges and unknown keys per field; then the cross-field rules of the
run config (docs/run-config.md, "The [config] table") run on every section that parsed.

`StateFile.client_version` is our extension: the client image version the run
requires (the run-manager pulls `psyche-client:<client_version>`); default "latest".
`StateFile.progress` is optional and lets a saved state resume at a later step.
These loaders are the only file reads in the coordinator package (the edge).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails

from coordinator.config_keys import UNKNOWN_KEY, PsycheSavedStateKeys
from coordinator.config_variants import (
    CHECKPOINT,
    LR_SCHEDULE,
    OPTIMIZER,
    U8,
    U16,
    U32,
    U64,
    AdamWOptimizer,
    Architecture,
    Checkpoint,
    ConstantLR,
    CosineLR,
    DataType,
    DistroOptimizer,
    DummyCheckpoint,
    DummyOptimizer,
    GcsCheckpoint,
    HubCheckpoint,
    LinearLR,
    LRSchedule,
    OptimizerConfig,
    P2PCheckpoint,
    P2PGcsCheckpoint,
    SparseLoCoOptimizer,
    StrictStr,
    WarmupStableDecayLR,
)
from coordinator.data_location import (
    DATA_LOCATION,
    DataLocation,
    DontShuffle,
    DummyDataLocation,
    GcpBucket,
    HttpDataLocation,
    HttpLocation,
    LocalDataLocation,
    NumberedFiles,
    PreprocessedDataLocation,
    SeededShuffle,
    ServerDataLocation,
    Shuffle,
    SingleUrl,
    TokenSize,
    UrlList,
    WeightedHttpDataLocation,
    seed_bytes,
)
from coordinator.limits import (
    CLIENT_VERSION_MAX_BYTES,
    MAX_CLIENTS,
    MAX_WITNESSES,
    RUN_ID_MAX_BYTES,
    RunState,
)

DEFAULT_CLIENT_VERSION = "latest"
# A state file describes a run between epochs; mid-epoch states live only in memory.
STARTABLE_RUN_STATES = ("Uninitialized", "WaitingForMembers", "Paused", "Finished")


class ConfigError(ValueError):
    """A configuration was rejected; `errors` holds one `key: rule` line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


_STRICT = ConfigDict(extra="forbid", frozen=True)


class CoordinatorConfig(BaseModel):
    """The 14 `[config]` fields; times are seconds. Rules: `coordinator_config_errors`."""

    model_config = _STRICT
    warmup_time: U64
    cooldown_time: U64
    max_round_train_time: U64
    round_witness_time: U64
    epoch_time: U64
    total_steps: U32
    init_min_clients: U16
    min_clients: U16
    witness_nodes: U16
    global_batch_size_start: U16
    global_batch_size_end: U16
    global_batch_size_warmup_tokens: U64
    verification_percent: U8
    waiting_for_members_extra_time: U8

    def witness_count(self, num_clients: int) -> int:
        """W: witnesses per round; 0 in the config means every client, capped at 32."""
        return self.witness_nodes or min(num_clients, MAX_WITNESSES)

    def batch_size(self, tokens_processed: int) -> int:
        """Global batch size (sequences) after `tokens_processed` tokens.

        size = end                                    if tokens >= warmup_tokens
             = round(start + (end - start) * tokens / warmup_tokens)   otherwise
        Rounding is half-away-from-zero like Rust's f64::round.
        """
        start, end = self.global_batch_size_start, self.global_batch_size_end
        warmup = self.global_batch_size_warmup_tokens
        if tokens_processed >= warmup:
            return end
        exact = start + (end - start) * (tokens_processed / warmup)
        return math.floor(exact + 0.5)


class LLMConfig(BaseModel):
    model_config = _STRICT
    architecture: Architecture
    data_type: DataType
    max_seq_len: Annotated[int, Field(strict=True, gt=0, le=2**32 - 1)]
    cold_start_warmup_steps: U32
    checkpoint: Annotated[Checkpoint, CHECKPOINT]
    data_location: Annotated[DataLocation, DATA_LOCATION]
    lr_schedule: Annotated[LRSchedule, LR_SCHEDULE]
    optimizer: Annotated[OptimizerConfig, OPTIMIZER]


class Progress(BaseModel):
    """Where a saved run resumes: step starts at 1."""

    model_config = _STRICT
    epoch: U16 = 0
    step: Annotated[int, Field(strict=True, ge=1, le=2**32 - 1)] = 1
    epoch_start_data_index: U64 = 0


def _model_field(value: Any) -> Any:
    """Unwrap `{LLM = {...}}`; the only variant of Psyche's `Model` enum."""
    if isinstance(value, LLMConfig):
        return value
    if isinstance(value, dict) and set(value) == {"LLM"}:
        return value["LLM"]
    raise ValueError("expected a table with the single key LLM ([model.LLM])")


class StateFile(PsycheSavedStateKeys):
    """A whole `state.toml` (Psyche's saved-state keys accepted: coordinator/config_keys.py)."""

    model_config = _STRICT
    run_id: StrictStr
    run_state: Literal["Uninitialized", "WaitingForMembers", "Paused", "Finished"]
    client_version: StrictStr = DEFAULT_CLIENT_VERSION
    config: CoordinatorConfig
    progress: Progress | None = None
    model: LLMConfig

    _unwrap_model = field_validator("model", mode="before")(_model_field)

    @field_validator("run_id", "client_version")
    @classmethod
    def _fits(cls, value: str, info: ValidationInfo) -> str:
        limit = RUN_ID_MAX_BYTES if info.field_name == "run_id" else CLIENT_VERSION_MAX_BYTES
        size = len(value.encode())
        if not value or size > limit:
            raise ValueError(f"must be 1 to {limit} bytes, got {size}")
        return value

    @property
    def initial_run_state(self) -> RunState:
        return RunState[self.run_state]

    def to_toml(self) -> str:
        data = self.model_dump(mode="json", exclude_none=True)
        data["model"] = {"LLM": data["model"]}
        return tomli_w.dumps(data)


class DataServerConfig(BaseModel):
    """`data.toml` of the TCP data server (it always shuffles with shuffle_seed)."""

    model_config = _STRICT
    dir: StrictStr
    token_size: TokenSize
    seq_len: Annotated[int, Field(strict=True, gt=0, le=2**32 - 1)]
    shuffle_seed: bytes

    _seed = field_validator("shuffle_seed", mode="before")(seed_bytes)

    @field_validator("token_size", mode="before")
    @classmethod
    def _token(cls, value: Any) -> Any:
        if isinstance(value, str) and value in TokenSize.__members__:
            return TokenSize[value]
        if isinstance(value, TokenSize):
            return value
        raise ValueError(f"expected TwoBytes or FourBytes, got {value!r}")


# ---------------------------------------------------------------- the rules


def coordinator_config_errors(cfg: CoordinatorConfig, prefix: str = "config.") -> list[str]:
    """Every cross-field rule of the [config] table (docs/run-config.md) that `cfg` breaks."""
    p = prefix
    errors: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            errors.append(message)

    need(cfg.epoch_time > 0, f"{p}epoch_time: must be > 0")
    need(cfg.warmup_time < cfg.epoch_time,
         f"{p}warmup_time: must be < {p}epoch_time ({cfg.epoch_time}), got {cfg.warmup_time}")
    need(cfg.cooldown_time > 0, f"{p}cooldown_time: must be > 0")
    need(0 < cfg.max_round_train_time < cfg.epoch_time,
         f"{p}max_round_train_time: must be > 0 and < {p}epoch_time ({cfg.epoch_time}), "
         f"got {cfg.max_round_train_time}")
    need(cfg.round_witness_time > 0, f"{p}round_witness_time: must be > 0")
    need(cfg.total_steps > 0, f"{p}total_steps: must be > 0")
    need(cfg.min_clients > 0, f"{p}min_clients: must be > 0")
    need(cfg.min_clients <= MAX_CLIENTS,
         f"{p}min_clients: must be <= {MAX_CLIENTS} (max clients), got {cfg.min_clients}")
    need(cfg.init_min_clients >= cfg.min_clients,
         f"{p}init_min_clients: must be >= {p}min_clients ({cfg.min_clients}), "
         f"got {cfg.init_min_clients}")
    need(cfg.init_min_clients <= MAX_CLIENTS,
         f"{p}init_min_clients: must be <= {MAX_CLIENTS} (max clients), got {cfg.init_min_clients}")
    need(cfg.witness_nodes <= MAX_WITNESSES,
         f"{p}witness_nodes: must be <= {MAX_WITNESSES}, got {cfg.witness_nodes}")
    need(cfg.witness_nodes <= cfg.min_clients,
         f"{p}witness_nodes: must be <= {p}min_clients ({cfg.min_clients}), got {cfg.witness_nodes}")
    need(cfg.global_batch_size_start > 0, f"{p}global_batch_size_start: must be > 0")
    need(cfg.global_batch_size_end >= cfg.global_batch_size_start,
         f"{p}global_batch_size_end: must be >= {p}global_batch_size_start "
         f"({cfg.global_batch_size_start}), got {cfg.global_batch_size_end}")
    need(cfg.verification_percent < 100,
         f"{p}verification_percent: must be < 100 (at 100 every client verifies and none "
         f"trains), got {cfg.verification_percent}")
    need(cfg.waiting_for_members_extra_time > 0, f"{p}waiting_for_members_extra_time: must be > 0")
    return errors


def llm_config_errors(llm: LLMConfig, cfg: CoordinatorConfig | None,
                      prefix: str = "model.LLM.", config_prefix: str = "config.") -> list[str]:
    """Rules joining [model.LLM] with [config]."""
    errors: list[str] = []
    if cfg is not None and cfg.max_round_train_time > 0 and cfg.warmup_time < cfg.epoch_time:
        # Cold-start rounds must fit in one epoch after warm-up.
        limit = (cfg.epoch_time - cfg.warmup_time) // cfg.max_round_train_time
        if llm.cold_start_warmup_steps > limit:
            c = config_prefix
            errors.append(
                f"{prefix}cold_start_warmup_steps: must be <= ({c}epoch_time - {c}warmup_time) "
                f"// {c}max_round_train_time ({limit}), got {llm.cold_start_warmup_steps}")
    if cfg is not None and isinstance(llm.optimizer, SparseLoCoOptimizer):
        # A round's batch is cut into inner_steps parts on every client: the clients a run
        # starts with each need a sample per inner step.
        needed = llm.optimizer.inner_steps * cfg.init_min_clients
        errors.extend(
            f"{config_prefix}{key}: must be >= {prefix}optimizer.SparseLoCo.inner_steps"
            f" x {config_prefix}init_min_clients ({needed}) so that every client has "
            f"a sample for each inner step, got {getattr(cfg, key)}"
            for key in ("global_batch_size_start", "global_batch_size_end")
            if getattr(cfg, key) < needed)
    return errors


# ---------------------------------------------------------------- loading


def _format_error(error: ErrorDetails) -> str:
    loc = [str(part) for part in error["loc"]]
    if loc[:1] == ["model"] and len(loc) > 1:
        loc.insert(1, "LLM")  # the validator unwrapped {LLM = ...}; name the TOML key
    key = ".".join(loc) or "(top level)"
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        return f"{key}: {UNKNOWN_KEY}"
    if kind == "missing":
        return f"{key}: missing required key"
    message = message.removeprefix("Value error, ")
    if kind in ("value_error", "variant_rejected", "variant_shape", "unknown_variant"):
        return f"{key}: {message}"
    return f"{key}: {message}, got {error['input']!r}"


def validation_messages(exc: ValidationError) -> list[str]:
    return [_format_error(error) for error in exc.errors()]


_Model = TypeVar("_Model", bound=BaseModel)


def _section_ok(model: type[_Model], data: Any) -> _Model | None:
    try:
        return model.model_validate(data)
    except ValidationError:
        return None


def state_file_from_dict(data: dict[str, Any]) -> StateFile:
    """Validate a parsed state.toml; raise ConfigError listing every problem."""
    errors: list[str] = []
    state: StateFile | None = None
    try:
        state = StateFile.model_validate(data)
    except ValidationError as exc:
        errors.extend(validation_messages(exc))
    # Cross-field rules on every section that parsed on its own, so that a type
    # error in [model] does not hide a broken rule in [config].
    cfg = state.config if state else _section_ok(CoordinatorConfig, data.get("config"))
    raw_model = data.get("model")
    llm = state.model if state else (
        _section_ok(LLMConfig, raw_model.get("LLM")) if isinstance(raw_model, dict) else None)
    if cfg is not None:
        errors.extend(coordinator_config_errors(cfg))
    if llm is not None:
        errors.extend(llm_config_errors(llm, cfg))
    if errors:
        raise ConfigError(errors)
    assert state is not None
    return state


def parse_state_toml(text: str) -> StateFile:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"TOML syntax error: {exc}"]) from None
    return state_file_from_dict(data)


def _read(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{what} {path}: cannot read: {exc}"]) from None


def load_state_file(path: str | Path) -> StateFile:
    text = _read(path, "state file")
    try:
        return parse_state_toml(text)
    except ConfigError as exc:
        raise ConfigError([f"{path}: {message}" for message in exc.errors]) from None


def parse_data_config(text: str, base_dir: str | Path = ".") -> DataServerConfig:
    """Parse data.toml; `dir` is resolved against `base_dir` (the file's folder)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"TOML syntax error: {exc}"]) from None
    try:
        parsed = DataServerConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_messages(exc)) from None
    resolved = (Path(base_dir) / parsed.dir).resolve()
    return parsed.model_copy(update={"dir": str(resolved)})


def load_data_config(path: str | Path) -> DataServerConfig:
    text = _read(path, "data config")
    try:
        return parse_data_config(text, Path(path).parent)
    except ConfigError as exc:
        raise ConfigError([f"{path}: {message}" for message in exc.errors]) from None


__all__ = [
    "DEFAULT_CLIENT_VERSION", "STARTABLE_RUN_STATES", "AdamWOptimizer", "Architecture",
    "Checkpoint", "ConfigError", "ConstantLR", "CoordinatorConfig", "CosineLR", "DataLocation",
    "DataServerConfig", "DataType", "DistroOptimizer", "DontShuffle", "DummyCheckpoint",
    "DummyDataLocation", "DummyOptimizer", "GcpBucket", "GcsCheckpoint", "HttpDataLocation", "HttpLocation",
    "HubCheckpoint", "LLMConfig", "LRSchedule", "LinearLR", "LocalDataLocation",
    "NumberedFiles", "OptimizerConfig", "P2PCheckpoint", "P2PGcsCheckpoint",
    "PreprocessedDataLocation", "Progress", "SeededShuffle", "ServerDataLocation", "Shuffle",
    "SingleUrl", "SparseLoCoOptimizer", "StateFile", "TokenSize", "UrlList", "WarmupStableDecayLR",
    "WeightedHttpDataLocation", "coordinator_config_errors", "llm_config_errors",
    "load_data_config", "load_state_file", "parse_data_config", "parse_state_toml",
    "state_file_from_dict", "validation_messages",
]
