"""The client's options, defined once: a tree of small frozen dataclasses, one per component
(connection, identity, p2p, training, checkpoints, observability, verification, evals), as
torchtitan's job config is.

Each field carries its command-line spelling as `Annotated` metadata (`Option(...)`): the
environment variable, the help, the bounds and, where it is not `--field-name`, the flag. `psyche-client train` makes its options from these
fields (client_image/config_options.py), so the flags, the environment variables and the
runtime (PsycheClient reads `ClientOptions.config`) all read this one definition.

Field names are unique across the tree and are the CLI's parameter names (`--keep-steps` is
`checkpoints.keep_steps`), so a flat `name=value` picks its field: `ClientConfig.of(run_id="r",
keep_steps=5)`, `config.replace(device="cpu")`.

Pure on purpose: no typer, no torch; what the CLI resolves from these values (the identity
from its key file, the device, the rank layout, the eval tasks) is ClientOptions' part.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Self


@dataclass(frozen=True)
class Option:
    """How one config field is spelled on the command line (its `Annotated` metadata)."""

    env: str | None  # the environment variable; None: the flag only (a testing switch)
    help: str | None = None
    flag: str | None = None  # default `--field-name`; "--tui/--no-tui" for a switch pair
    min: float | None = None
    max: float | None = None
    show_default: bool = True


@dataclass(frozen=True)
class ConnectionConfig:
    """Which run, and where its coordinator is: a TCP server or a Solana cluster."""

    run_id: Annotated[str, Option(env="RUN_ID", help="The run to join.")]
    server_addr: Annotated[str | None, Option(
        env="SERVER_ADDR", help="TCP run: the coordinator's HOST:PORT.")] = None
    rpc: Annotated[str | None, Option(
        env="RPC", help="Solana run: JSON-RPC URL of the cluster.")] = None
    rpc_2: Annotated[str | None, Option(env="RPC_2", help="Fallback JSON-RPC URL.")] = None
    ws_rpc: Annotated[str | None, Option(
        env="WS_RPC",
        help="Solana run: PubSub WebSocket URL (account subscriptions) [default: --rpc as "
             "ws://, port + 1].")] = None
    ws_rpc_2: Annotated[str | None, Option(
        env="WS_RPC_2", help="Fallback WebSocket URL [default: from --rpc-2].")] = None
    rpc_3: Annotated[str | None, Option(env="RPC_3", help="Second fallback JSON-RPC URL.")] = None
    ws_rpc_3: Annotated[str | None, Option(
        env="WS_RPC_3", help="Second fallback WebSocket URL [default: from --rpc-3].")] = None
    authorizer: Annotated[str | None, Option(
        env="AUTHORIZER",
        help="Solana run: join as a delegate of this authorization grantee.")] = None


@dataclass(frozen=True)
class IdentityConfig:
    """The node's key: the wallet on Solana, an iroh key on a TCP run."""

    wallet_private_key_path: Annotated[Path | None, Option(
        env="WALLET_PRIVATE_KEY_PATH",
        help="Solana run: solana-keygen keypair file; else RAW_WALLET_PRIVATE_KEY.")] = None
    identity_secret_key_path: Annotated[Path | None, Option(
        env="IDENTITY_SECRET_KEY_PATH",
        help="32 raw secret bytes; else RAW_IDENTITY_SECRET_KEY; else a fresh key.")] = None


@dataclass(frozen=True)
class P2PConfig:
    """The iroh endpoint and what it fetches from peers."""

    bind_p2p_port: Annotated[int, Option(env="BIND_P2P_PORT", min=0, max=65535)] = 0
    bind_p2p_interface: Annotated[str | None, Option(
        env="BIND_P2P_INTERFACE",
        help="An IP address, or an interface name pattern such as eth*.")] = None
    iroh_relay: Annotated[str, Option(
        env="IROH_RELAY",
        help="psyche (Psyche's relays) | n0 or default (iroh's) | disabled | relay URLs",
    )] = "default"
    iroh_discovery: Annotated[str, Option(
        env="IROH_DISCOVERY",
        help="local: peers' addresses come from the coordinator's client list.")] = "local"
    max_concurrent_parameter_requests: Annotated[int, Option(
        env="MAX_CONCURRENT_PARAMETER_REQUESTS", min=1)] = 8
    max_model_download_mbps: Annotated[float | None, Option(
        env="MAX_MODEL_DOWNLOAD_MBPS",
        help="cap on how fast a P2P run's model comes from peers at warm-up, in megabits "
             "per second (default: no cap)")] = None
    max_upload_mbps: Annotated[float | None, Option(
        env="MAX_UPLOAD_MBPS",
        help="cap on how fast this client serves peers over P2P (the model to joiners, its "
             "results each round; all together), in megabits per second (default: no cap)"
    )] = None


@dataclass(frozen=True)
class TrainingConfig:
    """Where and how this client trains its share of each batch."""

    device: Annotated[str, Option(env="DEVICE")] = "auto"
    micro_batch_size: Annotated[int, Option(
        env="MICRO_BATCH_SIZE", min=1,
        help="sequences per forward/backward; the assigned batch runs in as many as needed, "
             "gradients accumulating in fp32")] = 1
    dtype: Annotated[str, Option(
        env="DTYPE",
        help="compute dtype: auto (bf16 on CUDA, else fp32) | bf16 | fp32; weights stay fp32, "
             "so clients of either dtype share one model")] = "auto"
    activation_checkpointing: Annotated[bool, Option(
        env="ACTIVATION_CHECKPOINTING",
        flag="--activation-checkpointing/--no-activation-checkpointing",
        help="recompute activations in backward: less memory, more compute")] = False
    data_parallelism: Annotated[int, Option(
        env="DATA_PARALLELISM", min=1,
        help="D: ranks that shard the model (FSDP2) and split the batch")] = 1
    tensor_parallelism: Annotated[int, Option(
        env="TENSOR_PARALLELISM", min=1,
        help="T: ranks that split each block's attention and MLP")] = 1
    local_ranks: Annotated[int | None, Option(
        env="LOCAL_RANKS", min=1,
        help="of the D x T ranks, how many run on this host (default all); `psyche-client "
             "sidecar` runs the others")] = None
    main_port: Annotated[int, Option(
        env="PSYCHE_MAIN_PORT", min=0, max=65535,
        help="the ranks' rendezvous port (0: any free port; sidecars need a fixed one)")] = 0
    torch_threads: Annotated[int | None, Option(
        env="TORCH_THREADS", min=1,
        help="CPU threads for torch (default: torch's choice).")] = None
    dummy_training_delay_secs: Annotated[float, Option(
        env="DUMMY_TRAINING_DELAY_SECS", min=0,
        help="runs of the Dummy optimizer (Psyche's config/test): each step sleeps this long "
             "instead of training")] = 0.0
    write_gradients_dir: Annotated[Path | None, Option(env="WRITE_GRADIENTS_DIR")] = None


@dataclass(frozen=True)
class CheckpointConfig:
    """Where each epoch's checkpoint goes: a local directory, then the hub or a GCS bucket."""

    checkpoint_dir: Annotated[Path | None, Option(env="CHECKPOINT_DIR")] = None
    hub_repo: Annotated[str | None, Option(
        env="HUB_REPO",
        help="Upload checkpoints to this hub repo; the coordinator accepts reports only for "
             "the run's own repository.")] = None
    gcs_bucket: Annotated[str | None, Option(
        env="GCS_BUCKET",
        help="Upload checkpoints (and Psyche's manifest.json) to this GCS bucket "
             "(GOOGLE_APPLICATION_CREDENTIALS); the coordinator accepts reports only for the "
             "run's own bucket and prefix.")] = None
    gcs_prefix: Annotated[str | None, Option(
        env="GCS_PREFIX", help="the object name prefix of --gcs-bucket's uploads")] = None
    keep_steps: Annotated[int, Option(env="KEEP_STEPS", min=1)] = 3
    delete_old_steps: Annotated[bool, Option(env="DELETE_OLD_STEPS")] = True


@dataclass(frozen=True)
class ObservabilityConfig:
    """What the client shows: its logs or TUI, and its local metrics endpoint."""

    metrics_local_port: Annotated[int | None, Option(
        env="METRICS_LOCAL_PORT", min=1, max=65535)] = None
    logs: Annotated[str, Option(env="LOGS", help="tui | console | json | none")] = "console"
    # The spelling every program shares; --logs is Psyche's. Not in the environment: LOGS is.
    tui: Annotated[bool | None, Option(
        env=None, flag="--tui/--no-tui", show_default=False,
        help="--tui: --logs tui; --no-tui: console logs instead of a TUI")] = None
    events_dir: Annotated[Path | None, Option(
        env="EVENTS_DIR",
        help="write every event here as event files (docs/events.md; `psyche-testnet "
             "replay` shows them)")] = None
    keep_event_files: Annotated[int, Option(
        env="KEEP_EVENT_FILES", min=0,
        help="keep this client's newest N event files in --events-dir, removing the oldest "
             "when a new one opens (each start, each 16 MiB); 0 keeps them all")] = 5
    # W&B (client_image/telemetry/wandb_logging.py): no --wandb-project, no wandb import.
    wandb_project: Annotated[str | None, Option(
        env="WANDB_PROJECT",
        help="log each step's loss, lr, tokens/s, confidence and efficiency to this W&B "
             "project (WANDB_API_KEY; WANDB_MODE=offline keeps them on disk)")] = None
    wandb_run: Annotated[str | None, Option(
        env="WANDB_RUN", help="the W&B run's name [default: W&B picks one]")] = None
    wandb_group: Annotated[str | None, Option(
        env="WANDB_GROUP", help="the W&B group, e.g. the run id for all its clients")] = None
    wandb_entity: Annotated[str | None, Option(
        env="WANDB_ENTITY", help="the W&B team or user owning the project")] = None


@dataclass(frozen=True)
class VerificationConfig:
    """How this client is verified (its replay class), and testing the run's verification
    (never set by an honest client)."""

    # A Literal: Typer makes it a choice, so a bad value is a usage error naming the option
    # and both values before anything starts.
    replay_class: Annotated[Literal["machine", "none"], Option(
        env="REPLAY_CLASS",
        help="machine (default): join with the replay class of the settings this client's "
             "trainer declares, so that followers of the same class judge it with the tight "
             "limits; none: join without one (class 0): listed without waiting for clients of "
             "the same class, judged by any followers with the loose limits")] = "machine"

    test_adversary: Annotated[str | None, Option(
        env=None,
        help="testing verification only: publish dishonest results of this kind (random_signs "
             "| scaled | stale | zeros | flipped_signs | wrong_batch); the run's followers "
             "should report this client and the coordinator eject it")] = None


@dataclass(frozen=True)
class EvalConfig:
    """Benchmarks of the model while it is idle between epochs (docs/evals.md)."""

    eval_tasks: Annotated[str | None, Option(
        env="EVAL_TASKS",
        help="benchmarks to score the model on between epochs, comma-separated: arc_challenge,"
             " arc_easy, boolq, ceval_valid, hellaswag, mmlu, mmlu_cf, mmlu_pro (5-shot), "
             "openbookqa, piqa (docs/evals.md)")] = None
    eval_seed: Annotated[int, Option(
        env="EVAL_SEED", min=0, help="picks each task's documents (shuffled with it)")] = 42
    eval_task_max_docs: Annotated[int | None, Option(
        env="EVAL_TASK_MAX_DOCS", min=1, help="documents per task (default: all)")] = None
    eval_data_dir: Annotated[Path | None, Option(
        env="EVAL_DATA_DIR",
        help="<task>.jsonl or <task>.parquet files in the data set's format; else the Hugging "
             "Face cache, else the bundled samples")] = None
    prompt_task: Annotated[bool, Option(
        env="PROMPT_TASK",
        help="each epoch, log the model's greedy continuation of a prompt")] = False


@dataclass(frozen=True)
class ClientConfig:
    """Everything `psyche-client train` is told, by flag or environment variable."""

    connection: ConnectionConfig
    identity: IdentityConfig = dataclasses.field(default_factory=IdentityConfig)
    p2p: P2PConfig = dataclasses.field(default_factory=P2PConfig)
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    checkpoints: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    observability: ObservabilityConfig = dataclasses.field(default_factory=ObservabilityConfig)
    verification: VerificationConfig = dataclasses.field(default_factory=VerificationConfig)
    evals: EvalConfig = dataclasses.field(default_factory=EvalConfig)

    @classmethod
    def of(cls, **values: Any) -> Self:
        """The config from flat field names (`run_id` is required); the rest keep defaults."""
        groups = _split_by_group(values)
        return cls(**{name: group_type(**groups.get(name, {}))
                      for name, group_type in component_types().items()})

    def replace(self, **values: Any) -> Self:
        """This config with some fields (by flat name) changed."""
        groups = _split_by_group(values)
        return dataclasses.replace(self, **{
            name: dataclasses.replace(getattr(self, name), **changes)
            for name, changes in groups.items()})


@dataclass(frozen=True)
class ConfigOption:
    """One command-line option: its component, its field, its type and default, its spelling."""

    component: str  # the ClientConfig attribute: "checkpoints"
    name: str  # the field, also the CLI's parameter name: "keep_steps"
    type: Any  # the field's type without its Option: int | None
    default: Any  # dataclasses.MISSING when required
    spec: Option

    @property
    def flag(self) -> str:
        return self.spec.flag or "--" + self.name.replace("_", "-")


@cache
def component_types() -> dict[str, type]:
    """ClientConfig's components in order: attribute name -> dataclass."""
    hints = typing.get_type_hints(ClientConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(ClientConfig)}


@cache
def config_options() -> tuple[ConfigOption, ...]:
    """Every option of the tree, in the order `--help` lists them."""
    options: list[ConfigOption] = []
    for component, group_type in component_types().items():
        hints = typing.get_type_hints(group_type, include_extras=True)
        options.extend(ConfigOption(component, f.name, hints[f.name].__origin__, f.default,
                                    _option_of(hints[f.name]))
                       for f in dataclasses.fields(group_type))
    return tuple(options)


def _option_of(annotation: Any) -> Option:
    found = [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Option)]
    if len(found) != 1:
        raise TypeError(f"a client config field needs one Option: {annotation}")
    return found[0]


def _split_by_group(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    component_of = {o.name: o.component for o in config_options()}
    if unknown := sorted(set(values) - set(component_of)):
        raise TypeError(f"not a client config field: {', '.join(unknown)}")
    groups: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        groups.setdefault(component_of[name], {})[name] = value
    return groups
