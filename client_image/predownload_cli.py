"""``psyche-client predownload``: fetch a run's model and check its data before joining
(Psyche's ``predownload`` subcommand).

    psyche-client predownload --state state.toml
    psyche-client predownload --server-addr HOST:PORT --run-id RUN [--gcs-cache-dir DIR]
    psyche-client predownload --rpc URL --run-id RUN [--model] [--eval-tasks TASKS]

    run_config_from_coordinator(host, port, run_id, timeout_s) -> LLMConfig   (async)
    predownload_model(llm, gcs_cache_dir) -> list[str]    the lines of what was fetched
    check_data(llm) -> list[str]                           (async)

The run's model section comes from a state file, from a TCP coordinator as an observer
(`ProtocolConnection.connect(..., observe=True)`: the first StateUpdate, then it leaves),
or from a Solana run's coordinator account over JSON-RPC (client_image/predownload_solana.py).
The model is fetched where the client's warm-up would load it (runtime/model_keeper.py):
a `Hub` or `P2P` checkpoint's repo into the HF cache (`resolve_model_dir`; a local
directory is checked, not copied; a P2P run's current weights come from peers at warm-up,
the repo is the run's base model), a `Gcs` or `P2PGcs` checkpoint from its bucket into the
Gcs cache (`download_checkpoint_from_gcs`); a `Dummy` one is built at warm-up and needs
nothing. The model's config.json must be the run's architecture (training/architecture.py).
A model downloaded into a cache says `downloaded`, or `already in the cache, nothing
downloaded` when no file of the cache changed (the second run).
A remote data location (`Http`, its `Gcp` buckets, `WeightedHttp`, a `Preprocessed` hub
dataset) is opened as the client opens it (client_image/data `open_provider`): every token
file is reached and its size checked (HEAD or the bucket listing), a hub dataset
downloaded into the HF cache; `Server`, `Local` and `Dummy` need nothing beforehand.
`--eval-tasks` downloads each task's data set into the HF cache, where the client's evals
read it offline (client_image/evals/catalog.py), and checks the client finds its documents
there. `--model` and `--eval-tasks` (Psyche's flags) pick what is done; without either,
the model and the data location.

Each thing fetched or checked is printed on one line; exit 0. A run this client cannot
serve (a checkpoint or model it cannot load, a data file out of reach, no such run) is
one `error:` line on stderr, exit 1.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from coordinator.config import LLMConfig


class PredownloadError(RuntimeError):
    """The run cannot be served by this client: one line saying why."""


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=1)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _directory_line(what: str, directory: Path) -> str:
    files = sorted(p for p in directory.iterdir() if p.is_file())
    size = sum(p.stat().st_size for p in files)
    return f"{what} -> {directory} ({len(files)} files, {size} bytes)"


def cache_files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root`: relative path -> (size, mtime in ns); {} if it is absent."""
    if not root.is_dir():
        return {}
    found = {}
    for path in root.rglob("*"):
        if path.is_file():
            stat = path.stat()
            found[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return found


def cache_outcome(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> str:
    """What a download did to a cache: nothing changed, or which files came."""
    if before and before == after:
        return "already in the cache, nothing downloaded"
    changed = [name for name, seen in after.items() if before.get(name) != seen]
    return f"downloaded ({len(changed)} files)"


def hub_cache_root(repo_id: str, repo_type: str = "model") -> Path:
    """The repository's blobs in the HF cache: each file downloaded lands here once."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return (Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type=repo_type)
            / "blobs")


async def run_config_from_coordinator(host: str, port: int, run_id: str,
                                      timeout_s: float = 10.0) -> LLMConfig:
    """The run's model section, from the coordinator's first state update to an observer."""
    from coordinator import decode_state
    from coordinator_tcp.client import JoinRefused, ProtocolConnection
    from coordinator_tcp.protocol import ErrorReply, StateUpdate
    from psyche_common.identity import Identity

    try:
        connection, _ = await ProtocolConnection.connect(
            host, port, Identity.generate(), run_id, observe=True, timeout_s=timeout_s)
    except JoinRefused as exc:
        raise PredownloadError(f"the coordinator at {host}:{port} refused to show run "
                               f"{run_id!r}: {exc}") from None
    except (OSError, TimeoutError) as exc:
        raise PredownloadError(f"cannot reach the coordinator at {host}:{port}: "
                               f"{_one_line(exc) or type(exc).__name__}") from None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await connection.receive()
                if isinstance(message, StateUpdate):
                    return decode_state(message.state_bytes).model
                if isinstance(message, ErrorReply) and message.fatal:
                    raise PredownloadError(f"the coordinator at {host}:{port}: "
                                           f"{message.error}: {message.detail}")
    except TimeoutError:
        raise PredownloadError(f"the coordinator at {host}:{port} sent no state of run "
                               f"{run_id!r} in {timeout_s:g} s") from None
    finally:
        await connection.close()


def _check_model_architecture(directory: Path, architecture: str) -> None:
    from transformers import AutoConfig

    from client_image.training.architecture import ArchitectureMismatch, check_architecture

    try:
        check_architecture(AutoConfig.from_pretrained(directory), architecture)
    except ArchitectureMismatch as exc:
        raise PredownloadError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise PredownloadError(f"{directory}/config.json: {_one_line(exc)}") from None


def predownload_model(llm: LLMConfig, gcs_cache_dir: Path | None = None) -> list[str]:
    """Fetch the run's model where warm-up will load it (module docstring); its lines."""
    from client_image.training.checkpoint import CheckpointError
    from client_image.training.model import ModelLoadError, resolve_model_dir
    from coordinator.config import (
        DummyCheckpoint,
        GcsCheckpoint,
        HubCheckpoint,
        P2PCheckpoint,
        P2PGcsCheckpoint,
    )

    checkpoint = llm.checkpoint
    kind = type(checkpoint).TAG
    if isinstance(checkpoint, DummyCheckpoint):
        return [f"model: Dummy {checkpoint.repo_id or '(built-in)'}: built at warm-up, "
                "nothing to fetch"]
    cache: Path | None = None  # None: a local directory, read where it lies
    if isinstance(checkpoint, HubCheckpoint | P2PCheckpoint):
        if not Path(checkpoint.repo_id).expanduser().is_dir():
            from huggingface_hub.errors import HFValidationError

            try:
                cache = hub_cache_root(checkpoint.repo_id)
            except HFValidationError:
                cache = None  # not a repo id: resolve_model_dir says why in one line
        before = cache_files(cache) if cache else {}
        try:
            directory = resolve_model_dir(checkpoint.repo_id, revision=checkpoint.revision)
        except ModelLoadError as exc:
            raise PredownloadError(f"model {kind} {checkpoint.repo_id}: "
                                   f"{_one_line(exc)}") from None
        what = f"model: {kind} {checkpoint.repo_id}"
        if checkpoint.revision:
            what += f" @ {checkpoint.revision}"
    elif isinstance(checkpoint, GcsCheckpoint | P2PGcsCheckpoint):
        from client_image.training.gcs_checkpoint import (
            default_cache_dir,
            download_checkpoint_from_gcs,
            gcs_location,
        )

        location = gcs_location(checkpoint.bucket, checkpoint.prefix)
        # The layout download_checkpoint_from_gcs keeps: <cache>/<bucket>/<prefix>/<step>.
        cache = (Path(gcs_cache_dir or default_cache_dir()) / checkpoint.bucket
                 / (checkpoint.prefix or "").strip("/"))
        before = cache_files(cache)
        try:
            directory = download_checkpoint_from_gcs(checkpoint.bucket, checkpoint.prefix,
                                                     gcs_cache_dir)
        except (CheckpointError, OSError) as exc:
            raise PredownloadError(f"model {kind} {location}: {_one_line(exc)}") from None
        what = f"model: {kind} {location}"
    else:
        raise PredownloadError(f"model: checkpoint {kind} cannot be loaded by this client")
    _check_model_architecture(directory, llm.architecture)
    line = _directory_line(what, directory)
    if cache is not None:
        line += f": {cache_outcome(before, cache_files(cache))}"
    return [line]


def predownload_eval_tasks(names: tuple[str, ...]) -> list[str]:
    """Download each task's data set into the HF cache and check the client's evals find
    its documents there (client_image/evals/catalog.py reads the cache offline)."""
    from huggingface_hub import snapshot_download

    from client_image.evals.catalog import BUNDLED, TASKS, EvalDataError, load_task

    lines = []
    for name in names:
        spec = TASKS[name]
        splits = {spec.split, *([spec.fewshot.split] if spec.fewshot else [])}
        # Only the split files the evals read, not the whole data set.
        patterns = [f"{prefix}{split}*{suffix}" for split in sorted(splits)
                    for prefix in ("", "*/") for suffix in (".parquet", ".jsonl")]
        cache = hub_cache_root(spec.dataset, "dataset")
        before = cache_files(cache)
        try:
            snapshot_download(spec.dataset, repo_type="dataset", allow_patterns=patterns)
            task = load_task(name)
        except EvalDataError as exc:
            raise PredownloadError(f"eval {name}: {_one_line(exc)}") from None
        except Exception as exc:  # huggingface_hub raises many types for missing data sets
            raise PredownloadError(f"eval {name}: hub dataset {spec.dataset}: "
                                   f"{type(exc).__name__}: {_one_line(exc)}") from None
        if task.source == BUNDLED:
            raise PredownloadError(f"eval {name}: hub dataset {spec.dataset} has no "
                                   f"{spec.split} split files the client can read")
        lines.append(f"eval: {name} ({len(task.docs)} documents) from {task.source}: "
                     f"{cache_outcome(before, cache_files(cache))}")
    return lines


def _data_lines(provider: Any, kind: str) -> list[str]:
    """One line per file the opened provider reached (nested for WeightedHttp)."""
    nested = getattr(provider, "providers", None)
    if nested is not None:
        return [line for inner in nested for line in _data_lines(inner, kind)]
    urls, sizes = getattr(provider, "urls", None), getattr(provider, "sizes", None)
    if urls is not None and sizes is not None:
        return [f"data: {kind} {url} ({size} bytes)" for url, size in zip(urls, sizes,
                                                                          strict=True)]
    files = getattr(provider, "files", [])
    return [f"data: {kind} {file} ({Path(file).stat().st_size} bytes)" for file in files]


async def check_data(llm: LLMConfig) -> list[str]:
    """Reach every file of a remote data location (module docstring); its lines."""
    from client_image.data import DataProviderError, open_provider
    from coordinator.config import (
        HttpDataLocation,
        PreprocessedDataLocation,
        WeightedHttpDataLocation,
    )

    location = llm.data_location
    kind = type(location).TAG
    if not isinstance(location, HttpDataLocation | WeightedHttpDataLocation
                      | PreprocessedDataLocation):
        return [f"data: {kind}: read during the run, nothing to fetch"]
    if isinstance(location, PreprocessedDataLocation) and Path(location.source).is_dir():
        return [f"data: {kind} {location.source}: a local directory, nothing to fetch"]
    try:
        provider = await open_provider(location, llm.max_seq_len)
    except (DataProviderError, OSError) as exc:
        raise PredownloadError(f"data {kind}: {_one_line(exc)}") from None
    except Exception as exc:  # httpx and google-cloud raise their own types
        raise PredownloadError(f"data {kind}: {type(exc).__name__}: {_one_line(exc)}") from None
    try:
        lines = _data_lines(provider, kind)
        lines.append(f"data: {kind}: {provider.num_sequences} sequences of {llm.max_seq_len} "
                     "tokens reachable")
        return lines
    finally:
        close = getattr(provider, "aclose", None)
        if close is not None:
            await close()


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise typer.BadParameter(f"{address!r} is not HOST:PORT", param_hint="--server-addr")
    return host, int(port)


def _read_run(state: Path | None, server_addr: str | None, rpc: str | None,
              rpc_2: str | None, run_id: str | None, timeout_s: float) -> LLMConfig:
    """The run's model section from the one source given; a typer.Exit of one line if not."""
    if sum(source is not None for source in (state, server_addr, rpc)) != 1:
        raise _fail("give one of --state, --server-addr with --run-id (a TCP run) or --rpc "
                    "with --run-id (a Solana run)")
    if state is not None:
        from coordinator import load_state_file
        from coordinator.config import ConfigError

        try:
            return load_state_file(state).model
        except (ConfigError, OSError, ValueError) as exc:
            raise _fail(f"{state}: {_one_line(exc)}") from None
    if not run_id:
        raise _fail(f"{'--server-addr' if server_addr else '--rpc'} needs --run-id")
    try:
        if server_addr is not None:
            host, port = _split_address(server_addr)
            return asyncio.run(run_config_from_coordinator(host, port, run_id, timeout_s))
        from client_image.predownload_solana import run_config_from_solana

        return asyncio.run(run_config_from_solana([rpc, rpc_2], run_id, timeout_s))
    except PredownloadError as exc:
        raise _fail(str(exc)) from None


def predownload(
    state: Annotated[Path | None, typer.Option(
        "--state", help="The run's state.toml (instead of asking a coordinator).")] = None,
    server_addr: Annotated[str | None, typer.Option(
        "--server-addr", envvar="SERVER_ADDR",
        help="The TCP coordinator HOST:PORT to read the run from (with --run-id).")] = None,
    rpc: Annotated[str | None, typer.Option(
        "--rpc", envvar="RPC",
        help="Solana run: the cluster's JSON-RPC URL to read the run's coordinator account "
             "from (with --run-id).")] = None,
    rpc_2: Annotated[str | None, typer.Option(
        "--rpc-2", envvar="RPC_2", help="Fallback JSON-RPC URL.")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", envvar="RUN_ID")] = None,
    model: Annotated[bool, typer.Option(
        "--model", help="Download the run's model (without --model or --eval-tasks: the "
                        "model and the data location).")] = False,
    eval_tasks: Annotated[str | None, typer.Option(
        "--eval-tasks", help="Download these eval tasks' data sets (comma-separated, "
                             "--eval-tasks of train) into the HF cache.")] = None,
    gcs_cache_dir: Annotated[Path | None, typer.Option(
        "--gcs-cache-dir", help="Where Gcs checkpoints are downloaded (default: the "
                                "client's cache).")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.1,
                                             help="Coordinator connect and reply.")] = 10.0,
) -> None:
    """Fetch the run's model (and eval data) and check its data files, before joining."""
    tasks: tuple[str, ...] = ()
    if eval_tasks is not None:
        from client_image.evals.catalog import parse_task_names

        try:
            tasks = parse_task_names(eval_tasks)
        except ValueError as exc:
            raise _fail(f"--eval-tasks: {exc}") from None
        if not tasks:
            raise _fail("--eval-tasks: name at least one task")
    llm = _read_run(state, server_addr, rpc, rpc_2, run_id, timeout_s)
    everything = not model and not tasks
    try:
        if model or everything:
            for line in predownload_model(llm, gcs_cache_dir):
                typer.echo(line)
        for line in predownload_eval_tasks(tasks):
            typer.echo(line)
        if everything:
            for line in asyncio.run(check_data(llm)):
                typer.echo(line)
    except PredownloadError as exc:
        raise _fail(str(exc)) from None


def register(app: typer.Typer) -> None:
    app.command("predownload")(predownload)


__all__ = ["PredownloadError", "cache_files", "cache_outcome", "check_data", "hub_cache_root",
           "predownload_eval_tasks", "predownload_model", "register",
           "run_config_from_coordinator"]
