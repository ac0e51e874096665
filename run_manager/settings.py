"""The run-manager's settings: the operator's env file, validated at the edge.

`run-manager --env-file run.env` reads KEY=VALUE lines (and the process environment,
which wins over the file: pydantic-settings precedence init > env > dotenv). Every
missing or malformed value becomes one line naming its variable; nothing starts
until all of them are right. Psyche's keys and forms are accepted (the README's env
table): RAW_WALLET_PRIVATE_KEY as a JSON array or base58, winning over the wallet file
as in Psyche; no RUN_ID on Solana (the run-manager then picks a run, run_manager.discovery);
the keys of Psyche we do not use are named in warnings (`env_file_warnings`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from run_manager.gpus import GpuSetting, parse_gpus

# NVIDIA Container Toolkit driver capabilities (NVIDIA_DRIVER_CAPABILITIES).
KNOWN_DRIVER_CAPABILITIES = frozenset(
    {"all", "compute", "compat32", "graphics", "utility", "video", "display"}
)
_BASE58 = re.compile(r"[1-9A-HJ-NP-Za-km-z]{32,44}")
_HOST_PORT = re.compile(r"(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):(?P<port>\d{1,5})")


class SettingsError(Exception):
    """The settings are unusable; `problems` has one line per variable."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class RunManagerSettings(BaseSettings):
    """Everything `run-manager` reads from the env file."""

    model_config = SettingsConfigDict(
        env_file_encoding="utf-8",
        env_ignore_empty=True,
        extra="ignore",
        case_sensitive=True,
        populate_by_name=False,
    )

    COORDINATOR_ADDRESS: str | None = Field(
        default=None, validation_alias=AliasChoices("COORDINATOR_ADDRESS", "SERVER_ADDR")
    )
    """host:port of a TCP coordinator (TCP runs); SERVER_ADDR is accepted too."""
    RPC: str | None = None
    """Solana JSON-RPC endpoint (Solana runs)."""
    # After RPC: whether RUN_ID may be missing depends on it (validators see earlier fields).
    RUN_ID: str | None = Field(default=None, min_length=1, validate_default=True)
    """The run to join (at most 32 bytes, as the coordinator stores it). Optional on
    Solana, as in Psyche: the run-manager then picks a run the wallet may join."""
    WS_RPC: str | None = None
    """Its PubSub endpoint; default from RPC (ws:// or wss://, port + 1), as Solana's tools."""
    RPC_2: str | None = None
    """Fallback JSON-RPC endpoint."""
    WS_RPC_2: str | None = None
    RPC_3: str | None = None
    """A third JSON-RPC endpoint, tried after RPC_2 (Psyche's --rpc-3)."""
    WS_RPC_3: str | None = None
    WALLET_PRIVATE_KEY_PATH: Path | None = Field(
        default=None, validation_alias=AliasChoices("WALLET_PRIVATE_KEY_PATH", "WALLET_PATH")
    )
    """solana-keygen JSON keypair file; WALLET_PATH is accepted too (Psyche's docs)."""
    RAW_WALLET_PRIVATE_KEY: str | None = Field(default=None, repr=False)
    """The keypair itself, a JSON byte array or base58 (Psyche's forms); wins over the file."""
    AUTHORIZER: str | None = None
    """Public key of the join-authorization grantee the client joins as."""
    DATA_PARALLELISM: int = Field(default=1, ge=1, le=1024)
    TENSOR_PARALLELISM: int = Field(default=1, ge=1, le=1024)
    PSYCHE_MAIN_HOST: str | None = None
    """Psyche's sidecar switch: refused (run_manager.psyche_env.REFUSED)."""
    MICRO_BATCH_SIZE: int = Field(default=1, ge=1, le=65536)
    NVIDIA_DRIVER_CAPABILITIES: str = "compute,utility"

    # The run-manager's own knobs.
    CLIENT_IMAGE: str = "psyche-client"
    """Image repository; the tag is the client version the run wants."""
    GPUS: str = "auto"
    """auto: every GPU when the host has any (the CUDA image); all: always; none: CPU only;
    0,1,...: these GPUs (run_manager.gpus)."""
    METRICS_LOCAL_PORT: int = Field(default=6269, ge=1, le=65535)
    """Port of the client's local metrics endpoint (127.0.0.1, host network)."""
    MAX_CRASH_RESTARTS: int = Field(default=5, ge=0, le=1000)
    """Crash restarts in a row before giving up (the count resets after 120 s of uptime)."""
    CRASH_BACKOFF_S: float = Field(default=5.0, ge=0, le=3600)
    """First crash-restart delay; it doubles with each crash in a row (capped at 120 s)."""
    VERSION_CHANGE_DELAY_S: float = Field(default=5.0, ge=0, le=3600)
    """Pause before restarting with a new client version (exit code 10), as Psyche does."""
    SCRATCH_DIR: Path | None = None
    COORDINATOR_WAIT_S: float = Field(default=30.0, gt=0, le=3600)
    """How long to wait for the coordinator's state before giving up with an error."""
    AIRDROP_PROOFS: str | None = None
    """The proofs files `airdrop-create` (or `airdrop-update`) wrote: one, several separated
    by commas, or directories of them; the TUI's Pools & airdrops panel shows this wallet's
    allocations in those airdrops (the chain keeps only the Merkle root)."""

    @field_validator("RUN_ID")
    @classmethod
    def _run_id_fits(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            # Only a Solana run can look for a run to join (COORDINATOR_ADDRESS, when set,
            # makes it a TCP run). An invalid RPC is reported on its own line (it is then
            # missing from info.data): say nothing more here.
            if "RPC" in info.data and (info.data["RPC"] is None
                                       or info.data.get("COORDINATOR_ADDRESS") is not None):
                raise ValueError("required for a TCP run, not set (a Solana run, with RPC, "
                                 "may leave it out: the run-manager then picks one)")
            return value
        if len(value.encode()) > 32:
            raise ValueError(f"must be at most 32 bytes, got {len(value.encode())}")
        return value

    @field_validator("GPUS")
    @classmethod
    def _gpus(cls, value: str) -> str:
        setting = parse_gpus(value)
        return ",".join(setting.device_ids) if setting.mode == "ids" else setting.mode

    @field_validator("RAW_WALLET_PRIVATE_KEY")
    @classmethod
    def _keypair(cls, value: str | None) -> str | None:
        from psyche_common.wallet import WalletError, parse_keypair_text

        if value is not None:
            try:
                parse_keypair_text(value, "the value")  # never echo the key itself
            except WalletError as error:
                raise ValueError(str(error)) from None
        return value

    @field_validator("PSYCHE_MAIN_HOST")
    @classmethod
    def _refused(cls, value: str | None, info: ValidationInfo) -> str | None:
        from run_manager.psyche_env import REFUSED

        if value is not None:
            raise ValueError(f"refused: {REFUSED[str(info.field_name)]}")
        return value

    @field_validator("RPC", "RPC_2", "RPC_3")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"https?://[^\s/]+", value):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value

    @field_validator("WS_RPC", "WS_RPC_2", "WS_RPC_3")
    @classmethod
    def _ws_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"wss?://[^\s/]+", value):
            raise ValueError(f"must be a ws:// or wss:// URL, got {value!r}")
        return value

    @field_validator("COORDINATOR_ADDRESS")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return value
        match = _HOST_PORT.fullmatch(value)
        if match is None or not 1 <= int(match["port"]) <= 65535:
            raise ValueError(f"must be host:port with a port in 1..65535, got {value!r}")
        return value

    @field_validator("AUTHORIZER")
    @classmethod
    def _base58_pubkey(cls, value: str | None) -> str | None:
        if value is not None and not _BASE58.fullmatch(value):
            raise ValueError(f"must be a base58 public key, got {value!r}")
        return value

    @field_validator("NVIDIA_DRIVER_CAPABILITIES")
    @classmethod
    def _known_capabilities(cls, value: str) -> str:
        unknown = [c for c in value.split(",") if c.strip() not in KNOWN_DRIVER_CAPABILITIES]
        if unknown:
            known = ", ".join(sorted(KNOWN_DRIVER_CAPABILITIES))
            raise ValueError(f"unknown capabilities {unknown} (known: {known})")
        return value

    @model_validator(mode="after")
    def _backend_is_complete(self) -> RunManagerSettings:
        if self.COORDINATOR_ADDRESS is None and self.RPC is None:
            raise ValueError(
                "COORDINATOR_ADDRESS (TCP run) or RPC (Solana run): one is required, neither is set"
            )
        if self.RPC is not None:
            if self.WS_RPC is None:  # derived, as the client and Solana's tools do
                from psyche_solana.subscription import default_ws_url

                self.WS_RPC = default_ws_url(self.RPC)
            if self.WALLET_PRIVATE_KEY_PATH is None and self.RAW_WALLET_PRIVATE_KEY is None:
                raise ValueError("WALLET_PRIVATE_KEY_PATH or RAW_WALLET_PRIVATE_KEY: one is "
                                 "required with RPC (Solana run), neither is set")
        return self

    @property
    def run_id(self) -> str:
        """RUN_ID, set by the env file or by run_manager.discovery."""
        if self.RUN_ID is None:
            raise SettingsError(["RUN_ID: not set, and no run was picked"])
        return self.RUN_ID

    def wallet_bytes(self) -> bytes | None:
        """The wallet's 64 keypair bytes: RAW_WALLET_PRIVATE_KEY, else the file (as Psyche)."""
        from psyche_common.wallet import load_keypair_bytes, parse_keypair_text

        if self.RAW_WALLET_PRIVATE_KEY is not None:
            return parse_keypair_text(self.RAW_WALLET_PRIVATE_KEY, "RAW_WALLET_PRIVATE_KEY")
        if self.WALLET_PRIVATE_KEY_PATH is not None:
            return load_keypair_bytes(self.WALLET_PRIVATE_KEY_PATH)
        return None

    @property
    def gpu_setting(self) -> GpuSetting:
        return parse_gpus(self.GPUS)

    @property
    def data_parallelism_set(self) -> bool:
        """DATA_PARALLELISM came from the env file or the shell (else the GPU count decides)."""
        return "DATA_PARALLELISM" in self.model_fields_set

    @property
    def rpc_urls(self) -> list[str | None]:
        """RPC, then the fallbacks RPC_2 and RPC_3, as Psyche tries them."""
        return [self.RPC, self.RPC_2, self.RPC_3]

    @property
    def ws_rpc_urls(self) -> list[str | None]:
        """WS_RPC, WS_RPC_2, WS_RPC_3 (a missing fallback is derived from its RPC)."""
        return [self.WS_RPC, self.WS_RPC_2, self.WS_RPC_3]

    @property
    def backend(self) -> Literal["tcp", "solana"]:
        return "tcp" if self.COORDINATOR_ADDRESS is not None else "solana"

    def container_environment(self, env_file_variables: dict[str, str] | None = None) -> dict[str, str]:
        """The variables the client container receives.

        Psyche passes its whole env file on (`docker run --env-file F`): the client's
        own options (IROH_RELAY, DEVICE, LOGS, TORCH_THREADS...) are set there. On top,
        the validated settings, and SERVER_ADDR, the name `psyche-client train` reads
        the TCP coordinator's address from. Host paths (the wallet file) stay out: the
        container cannot see them; the key travels as RAW_WALLET_PRIVATE_KEY.
        """
        environment = {
            name: value
            for name, value in (env_file_variables or {}).items()
            if name not in HOST_ONLY_VARIABLES
        }
        names = [
            "RUN_ID", "COORDINATOR_ADDRESS", "RPC", "WS_RPC", "RPC_2", "WS_RPC_2", "RPC_3",
            "WS_RPC_3",
            "AUTHORIZER", "DATA_PARALLELISM", "TENSOR_PARALLELISM", "MICRO_BATCH_SIZE",
            "NVIDIA_DRIVER_CAPABILITIES", "METRICS_LOCAL_PORT",
        ]  # fmt: skip
        values = {name: getattr(self, name) for name in names}
        environment.update({name: str(value) for name, value in values.items() if value is not None})
        environment.pop("RAW_WALLET_PRIVATE_KEY", None)  # the supervisor sets the resolved one
        if self.COORDINATOR_ADDRESS is not None:
            environment["SERVER_ADDR"] = self.COORDINATOR_ADDRESS
        return environment


# Variables of the env file that name things on the host only.
HOST_ONLY_VARIABLES = frozenset({"WALLET_PRIVATE_KEY_PATH", "WALLET_PATH", "SCRATCH_DIR",
                                 "AIRDROP_PROOFS"})


def unread_variables(variables: dict[str, str]) -> list[str]:
    """Env-file keys that neither the run-manager nor the client reads (typos, or Psyche's)."""
    from psyche_common.client_env import read_by_client

    mine: set[str] = set(HOST_ONLY_VARIABLES)
    for name, field in RunManagerSettings.model_fields.items():
        mine.add(name)
        if isinstance(field.validation_alias, AliasChoices):
            mine.update(str(choice) for choice in field.validation_alias.choices)
    return sorted(name for name in variables
                  if name not in mine and name not in PROGRAM_ID_VARIABLES
                  and not read_by_client(name))


# Read by psyche_solana.ids, in the run-manager and in the client (docs/solana.md).
PROGRAM_ID_VARIABLES = frozenset(f"PSYCHE_{name}_PROGRAM_ID"
                                 for name in ("COORDINATOR", "AUTHORIZER", "TREASURER"))


def env_file_warnings(variables: dict[str, str],
                      settings: RunManagerSettings | None = None) -> list[str]:
    """One line per setting that will not take effect: Psyche's env-file keys we do not
    use, keys nobody reads, and a wallet file that RAW_WALLET_PRIVATE_KEY overrides."""
    from run_manager.psyche_env import IGNORED, ignored_warning

    lines = [ignored_warning(name) if name in IGNORED
             else f"{name} is read by neither the run-manager nor the client (a typo?)"
             for name in unread_variables(variables)]
    if (settings is not None and settings.RAW_WALLET_PRIVATE_KEY is not None
            and settings.WALLET_PRIVATE_KEY_PATH is not None):
        lines.append("RAW_WALLET_PRIVATE_KEY and WALLET_PRIVATE_KEY_PATH are both set: the "
                     "wallet is RAW_WALLET_PRIVATE_KEY, as in Psyche (the file is not used)")
    return lines


def read_env_file(env_file: Path) -> dict[str, str]:
    """The KEY=VALUE pairs of an env file, parsed as pydantic-settings parses it."""
    from dotenv import dotenv_values

    return {key: value for key, value in dotenv_values(env_file).items() if value is not None}


def load_settings(env_file: Path | None, overrides: dict[str, Any] | None = None) -> RunManagerSettings:
    """Reads and validates the settings, then checks the wallet file is a usable keypair.

    Raises SettingsError with one line per problem, each naming its variable.
    """
    if env_file is not None and not env_file.is_file():
        raise SettingsError([f"--env-file {env_file}: no such file"])
    try:
        settings = RunManagerSettings(_env_file=env_file, **(overrides or {}))  # type: ignore[call-arg]  # _env_file is a BaseSettings init option, not a field
    except ValidationError as error:
        raise SettingsError(describe_validation_error(error)) from None
    if settings.RAW_WALLET_PRIVATE_KEY is None and settings.WALLET_PRIVATE_KEY_PATH is not None:
        from psyche_common.wallet import WalletError, load_keypair_bytes

        try:
            load_keypair_bytes(settings.WALLET_PRIVATE_KEY_PATH)
        except WalletError as error:
            raise SettingsError([f"WALLET_PRIVATE_KEY_PATH: {error}"]) from None
    return settings


def describe_validation_error(error: ValidationError) -> list[str]:
    """One line per pydantic error, led by the variable it is about."""
    problems = []
    for item in error.errors():
        variable = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "missing":
            problems.append(f"{variable}: required, not set")
        elif not variable:
            problems.append(message)  # model-level checks name their variables themselves
        else:
            problems.append(f"{variable}: {message} (got {item.get('input')!r})"
                            if item["type"] != "value_error" else f"{variable}: {message}")
    return problems
