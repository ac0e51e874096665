"""What `psyche-coordinator run` does: load or resume, start the servers, stop on a signal.

    options = RunOptions(state_path=Path("state.toml"), server=ServerOptions(port=20000), ...)
    exit_code = asyncio.run(run_coordinator(options))

Resuming: when `--save-state-dir` holds a `state.bin`, that state is the run (the
state.toml still has to be valid; its run_id must match the saved one), except that the
state.toml's checkpoint location (Hub repo_id, GCS bucket and prefix) replaces a
different saved one: the location is the authority's, clients only report revisions.
The TCP data server starts when the run's data location is `Server("host:port")`, on
that port; it needs the data.toml (`--data-config`), whose seq_len must equal the
model's max_seq_len.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from coordinator import Coordinator
from coordinator.capabilities import unsupported_fields
from coordinator.checkpoint_reports import describe_location, with_configured_location
from coordinator.config import (
    ConfigError,
    DataServerConfig,
    ServerDataLocation,
    StateFile,
    load_data_config,
    load_state_file,
)
from coordinator.machine import coordinator_from_state
from coordinator_tcp.event_recording import CoordinatorEventRecorder
from coordinator_tcp.persistence import PersistenceError, StateStore
from coordinator_tcp.server import CoordinatorServer, ServerOptions
from psyche_common.stopping import StopSignals, run_app_until_stopped, say
from psyche_common.tcp.connection import parse_host_port

if TYPE_CHECKING:
    from coordinator_tcp.data_server import DataServer
    from psyche_common.telemetry import Telemetry, TelemetryOptions

log = logging.getLogger("coordinator_tcp")


@dataclass
class RunOptions:
    state_path: Path
    server: ServerOptions = field(default_factory=ServerOptions)
    data_config_path: Path | None = None
    tui: bool = False
    telemetry: TelemetryOptions | None = None
    # The operator accepts that the run's newer model is lost (coordinator.Coordinator
    # .accept_model_loss) on the state it resumes from --save-state-dir.
    accept_model_loss: bool = False


@dataclass
class LoadedRun:
    coordinator: Coordinator
    p2p_addresses: dict[str, str]
    resumed: bool
    data_config: DataServerConfig | None
    data_address: tuple[str, int] | None


def load_run(options: RunOptions) -> LoadedRun:
    """Validate everything before anything listens; ConfigError lists every problem,
    values of the state file our client cannot run included (coordinator/capabilities.py)."""
    errors: list[str] = []
    state_file: StateFile | None = None
    data_config: DataServerConfig | None = None
    try:
        state_file = load_state_file(options.state_path)
    except ConfigError as exc:
        errors += exc.errors
    else:  # a run its clients cannot train is refused before anyone joins
        errors += [f"{options.state_path}: {line}" for line in unsupported_fields(state_file)]
    if options.data_config_path is not None:
        try:
            data_config = load_data_config(options.data_config_path)
        except ConfigError as exc:
            errors += exc.errors
        else:
            # Imported here: the data server needs torch, which a coordinator serving
            # no data never loads (about 190 MB of its memory and most of its start-up).
            from coordinator_tcp.data_server import data_problems

            errors += data_problems(data_config, str(options.data_config_path))
    if errors or state_file is None:
        raise ConfigError(errors)

    location = state_file.model.data_location
    data_address: tuple[str, int] | None = None
    if isinstance(location, ServerDataLocation):
        data_address = parse_host_port(location.address, "model.LLM.data_location")
        if data_config is None:
            errors.append(f"model.LLM.data_location is Server({location.address!r}): "
                          "pass --data-config data.toml for the TCP data server")
        elif data_config.seq_len != state_file.model.max_seq_len:
            errors.append(f"{options.data_config_path}: seq_len ({data_config.seq_len}) must "
                          f"equal model.LLM.max_seq_len ({state_file.model.max_seq_len})")
    elif data_config is not None:
        errors.append(f"--data-config given but model.LLM.data_location is "
                      f"{type(location).__name__}, not Server(\"host:port\")")
    if errors:
        raise ConfigError(errors)

    coordinator = Coordinator.from_state_file(state_file)
    addresses: dict[str, str] = {}
    resumed = False
    if options.server.save_state_dir is not None:
        try:
            saved = StateStore(options.server.save_state_dir).load()
        except PersistenceError as exc:
            raise ConfigError([f"--save-state-dir: {exc}"]) from None
        if saved is not None:
            state, addresses = saved
            if state.run_id != state_file.run_id:
                raise ConfigError([
                    f"--save-state-dir holds run {state.run_id!r}, the state file is for "
                    f"{state_file.run_id!r}: use another directory"])
            # --init-warmup-time rewrites warmup_time in the live (and saved) config until
            # the run first becomes active; the configured value comes from the state file.
            state.config = state.config.model_copy(
                update={"warmup_time": state_file.config.warmup_time})
            # The checkpoint's location is the authority's (clients may only report new
            # revisions of it): restarting with an edited state file is how a TCP run's
            # authority moves it.
            checkpoint = with_configured_location(state.model.checkpoint,
                                                  state_file.model.checkpoint)
            if checkpoint != state.model.checkpoint:
                log.warning("the state file moves the run's checkpoint from %s to %s",
                            describe_location(state.model.checkpoint),
                            describe_location(checkpoint))
                state.model = state.model.model_copy(update={"checkpoint": checkpoint})
            coordinator, resumed = coordinator_from_state(state), True
    if options.accept_model_loss:
        if not resumed:
            raise ConfigError(["--accept-model-loss: no saved state to accept it on (it "
                               "needs --save-state-dir holding the run's state)"])
        refused = coordinator.accept_model_loss()
        if refused is not None:
            raise ConfigError([f"--accept-model-loss: {refused.detail}"])
        log.warning("--accept-model-loss: the run goes on from its stored checkpoint %s; the "
                    "training since is lost (model resets: %d)",
                    describe_location(coordinator.state.model.checkpoint),
                    coordinator.state.model_resets)
    return LoadedRun(coordinator, addresses, resumed, data_config, data_address)


def listen_error(exc: OSError, what: str, host: str, port: int) -> str:
    """The one line a server that cannot listen prints (no traceback)."""
    if exc.errno == errno.EADDRINUSE:
        return f"error: port {port} is in use: cannot listen on {host}:{port} ({what})"
    reason = exc.strerror or str(exc)
    return f"error: cannot listen on {host}:{port} ({what}): {reason}"


async def run_coordinator(options: RunOptions, stop: asyncio.Event | None = None) -> int:
    """Serve until SIGINT/SIGTERM/SIGHUP (or `stop` is set); returns the process exit code:
    0 after a stop (by a signal, `stop`, or the TUI's q / ctrl+c / ctrl+q), 1 when the run
    cannot start (a config error, or a port in use: one line on stderr, no traceback)."""
    signals = StopSignals(stop)
    signals.install()  # before anything else: a signal while loading still stops cleanly
    try:
        return await _serve(options, signals)
    finally:
        signals.remove()


async def _serve(options: RunOptions, signals: StopSignals) -> int:
    try:
        loaded = load_run(options)
    except ConfigError as exc:
        for line in exc.errors:  # the same lines validate-config prints
            print(line, file=sys.stderr)
        return 1

    server = CoordinatorServer(loaded.coordinator, options.server,
                               p2p_addresses=loaded.p2p_addresses, resumed=loaded.resumed)
    recorder: CoordinatorEventRecorder | None = None
    if options.server.events_dir is not None:
        try:
            recorder = CoordinatorEventRecorder(options.server.events_dir)
        except OSError as exc:
            say(f"error: --events-dir {options.server.events_dir}: {exc.strerror or exc}")
            return 2
        recorder.attach(server)
    data_server: DataServer | None = None
    if loaded.data_config is not None and loaded.data_address is not None:
        from coordinator_tcp.data_server import DataServer, DataServerOptions

        host, port = loaded.data_address
        bind = options.server.host if host not in ("127.0.0.1", "localhost", "::1") else host
        data_server = DataServer(
            loaded.data_config, server.state.run_id,
            members=lambda: [c.id.key for c in server.state.epoch_state.clients],
            options=DataServerOptions(host=bind, port=port))
    if loaded.resumed:
        log.info("resuming run %r from %s: %s, epoch %d, step %d", server.state.run_id,
                 options.server.save_state_dir, server.state.run_state.name,
                 server.state.progress.epoch, server.state.progress.step)
    telemetry: Telemetry | None = None
    error: str | None = None
    started = False
    try:
        try:
            telemetry = _start_telemetry(options, server)
        except OSError as exc:
            assert options.telemetry is not None  # only a configured export listens
            error = listen_error(exc, "--prometheus-port", options.telemetry.prometheus_host,
                                 options.telemetry.prometheus_port or 0)
        if error is None:
            try:
                await server.start()
            except OSError as exc:
                error = listen_error(exc, "--server-port", options.server.host,
                                     options.server.port)
        if error is None and data_server is not None:
            try:
                await data_server.start()
            except OSError as exc:
                error = listen_error(exc, "the data server of model.LLM.data_location",
                                     data_server.options.host, data_server.options.port)
        started = error is None
        if started:
            # What is loaded by now (modules, the config, the state: about 190 k objects)
            # lives as long as the server: out of the cycle collector's sight, a full
            # collection with 1000 clients connected takes about 8 ms instead of 100+,
            # a pause that would land in some broadcast (bench/server_load.py).
            gc.freeze()
    finally:
        if not started:  # (a port in use, or a cancellation) nothing is left listening
            await _shut_down(server, data_server, telemetry, save=False)
    if error is not None:
        if recorder is not None:
            recorder.close()
        say(error)
        return 1
    reason = signals.reason
    try:
        if options.tui:
            reason = await _run_tui(server, data_server, signals)
        else:
            await signals.event.wait()
            reason = signals.reason
    finally:
        if options.tui:  # the TUI has given the terminal back: say it there too
            say(f"stopping… ({reason})")
        log.info("stopping… (%s)", reason)
        await _shut_down(server, data_server, telemetry, save=True)
        if recorder is not None:
            recorder.close()
        timing = server.stats.broadcast_ms()
        log.info("stopped after %d broadcasts%s", server.stats.broadcasts,
                 "" if timing is None else "; each written to every client in p50 "
                 f"{timing[0]:.2f} ms, p99 {timing[1]:.2f} ms (from the change of state)")
    return 0


async def _run_tui(server: CoordinatorServer, data_server: DataServer | None,
                   signals: StopSignals) -> str:
    """The TUI until it quits (q, ctrl+c, ctrl+q) or a signal; returns why it stopped."""
    from coordinator_tcp.tui import CoordinatorApp

    app = CoordinatorApp(server, data_server)
    await run_app_until_stopped(app, signals, app.stop_for)
    return app.stopping or signals.reason


async def _shut_down(server: CoordinatorServer, data_server: DataServer | None,
                     telemetry: Telemetry | None, *, save: bool) -> None:
    """Close every connection and listening socket; save the final state (--save-state-dir)."""
    if data_server is not None:
        await data_server.stop()
    await server.stop()
    if save and server.store is not None:
        try:
            server.save_state()
            log.info("state saved to %s", server.store.directory)
        except (OSError, PersistenceError) as exc:
            log.error("could not save the state: %s", exc)
    if telemetry is not None:
        await asyncio.to_thread(telemetry.shutdown)  # final flush, bounded by its timeout


def _start_telemetry(options: RunOptions, server: CoordinatorServer) -> Telemetry | None:
    """The server's metrics (and logs/spans) when an export is configured."""
    if options.telemetry is None or not options.telemetry.exports_anything:
        return None
    from coordinator_tcp.telemetry import CoordinatorTelemetry
    from psyche_common.telemetry import ServiceIdentity, Telemetry

    telemetry = Telemetry.start(options.telemetry, ServiceIdentity(
        "coordinator", "server", server.state.run_id, server.state.client_version))
    CoordinatorTelemetry(telemetry, server)
    return telemetry
