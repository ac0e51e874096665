"""``psyche-client predownload``: fetch a run's model and check its data before joining
(Psyche's ``predownload`` subcommand).

    psyche-client predownload --state state.toml
    psyche-client predownload --server-addr HOST:PORT --run-id RUN [--gcs-cache-dir DIR]

    run_config_from_coordinator(host, port, run_id, timeout_s) -> LLMConfig   (async)
    predownload_model(llm, gcs_cache_dir) -> list[str]    the lines of what was fetched
    check_data(llm) -> list[str]                           (async)

The run's model section comes from a state file, or from a TCP coordinator as an observer
(`ProtocolConnection.connect(..., observe=True)`: the first StateUpdate, then it leaves).
The model is fetched where the client's warm-up would load it (runtime/model_keeper.py):
a `Hub` or `P2P` checkpoint's repo into the HF cache (`resolve_model_dir`; a local
directory is checked, not copied; a P2P run's current weights come from peers at warm-up,
the repo is the run's base model), a `Gcs` or `P2PGcs` checkpoint from its bucket into the
Gcs cache (`download_checkpoint_from_gcs`); a `Dummy` one is built at warm-up and needs
nothing. The model's config.json must be the run's architecture (training/architecture.py).
A remote data location (`Http`, its `Gcp` buckets, `WeightedHttp`, a `Preprocessed` hub
dataset) is opened as the client opens it (client_image/data `open_provider`): every token
file is reached and its size checked (HEAD or the bucket listing), a hub dataset
downloaded into the HF cache; `Server`, `Local` and `Dummy` need nothing beforehand.
Psyche's predownload also fetches evaluation data: ours is bundled (client_image/evals).

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
    if isinstance(checkpoint, HubCheckpoint | P2PCheckpoint):
        try:
            directory = resolve_model_dir(checkpoint.repo_id, revision=checkpoint.revision)
        except ModelLoadError as exc:
            raise PredownloadError(f"model {kind} {checkpoint.repo_id}: "
                                   f"{_one_line(exc)}") from None
        what = f"model: {kind} {checkpoint.repo_id}"
    elif isinstance(checkpoint, GcsCheckpoint | P2PGcsCheckpoint):
        from client_image.training.gcs_checkpoint import (
            download_checkpoint_from_gcs,
            gcs_location,
        )

        location = gcs_location(checkpoint.bucket, checkpoint.prefix)
        try:
            directory = download_checkpoint_from_gcs(checkpoint.bucket, checkpoint.prefix,
                                                     gcs_cache_dir)
        except (CheckpointError, OSError) as exc:
            raise PredownloadError(f"model {kind} {location}: {_one_line(exc)}") from None
        what = f"model: {kind} {location}"
    else:
        raise PredownloadError(f"model: checkpoint {kind} cannot be loaded by this client")
    _check_model_architecture(directory, llm.architecture)
    return [_directory_line(what, directory)]


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


def predownload(
    state: Annotated[Path | None, typer.Option(
        "--state", help="The run's state.toml (instead of asking a coordinator).")] = None,
    server_addr: Annotated[str | None, typer.Option(
        "--server-addr", envvar="SERVER_ADDR",
        help="The TCP coordinator HOST:PORT to read the run from (with --run-id).")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", envvar="RUN_ID")] = None,
    gcs_cache_dir: Annotated[Path | None, typer.Option(
        "--gcs-cache-dir", help="Where Gcs checkpoints are downloaded (default: the "
                                "client's cache).")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.1,
                                             help="Coordinator connect and reply.")] = 10.0,
) -> None:
    """Fetch the run's model and check its data files, before joining."""
    if (state is None) == (server_addr is None):
        raise _fail("give either --state or --server-addr with --run-id")
    if state is not None:
        from coordinator import load_state_file
        from coordinator.config import ConfigError

        try:
            llm = load_state_file(state).model
        except (ConfigError, OSError, ValueError) as exc:
            raise _fail(f"{state}: {_one_line(exc)}") from None
    else:
        assert server_addr is not None
        if not run_id:
            raise _fail("--server-addr needs --run-id")
        host, port = _split_address(server_addr)
        try:
            llm = asyncio.run(run_config_from_coordinator(host, port, run_id, timeout_s))
        except PredownloadError as exc:
            raise _fail(str(exc)) from None
    try:
        for line in predownload_model(llm, gcs_cache_dir):
            typer.echo(line)
        for line in asyncio.run(check_data(llm)):
            typer.echo(line)
    except PredownloadError as exc:
        raise _fail(str(exc)) from None


def register(app: typer.Typer) -> None:
    app.command("predownload")(predownload)


__all__ = ["PredownloadError", "check_data", "predownload_model", "register",
           "run_config_from_coordinator"]
