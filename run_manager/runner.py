"""`run-manager --env-file F`: settings -> coordinator source -> supervisor, with or without TUI."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from psyche_common.stopping import StopSignals, say
from psyche_common.ui.view import describe_run, describe_training, describe_witnesses
from run_manager.coordinator_health import alarm_key, describe_coordinator_health
from run_manager.docker_supervisor import (
    ContainerStarted,
    LogLine,
    Supervisor,
    SupervisorConfig,
    SupervisorEvent,
    SupervisorFinished,
)
from run_manager.gpus import (
    GpuProbe,
    GpuSelectionError,
    HostGpuProbe,
    default_data_parallelism,
    plan_gpus,
)
from run_manager.join_check import FinishedRunCheck, JoinCheck
from run_manager.monitor import Monitor, Part
from run_manager.settings import RunManagerSettings
from run_manager.sources.coordinator import CoordinatorSource, PinnedVersionSource
from run_manager.view import (
    Dashboard,
    describe_container,
    describe_verification,
    describe_wallet,
)

POLL_STOP_S = 2.0  # a stopping run-manager waits this long for a poll in flight


class SourceUnavailable(Exception):
    """No coordinator source can serve these settings yet."""


def _tcp_source(settings: RunManagerSettings) -> CoordinatorSource:
    # Imported here: the coordinator packages are not needed by --help or --client-version.
    from run_manager.sources.tcp_coordinator import TcpCoordinatorSource

    assert settings.COORDINATOR_ADDRESS is not None  # the "tcp" backend means it is set
    return TcpCoordinatorSource(
        settings.COORDINATOR_ADDRESS, settings.run_id, wait_s=settings.COORDINATOR_WAIT_S
    )


def _solana_source(settings: RunManagerSettings) -> CoordinatorSource:
    # Imported here: solders and the account decoders are not needed by --help.
    from run_manager.sources.solana_coordinator import SolanaCoordinatorSource

    return SolanaCoordinatorSource(settings.rpc_urls, settings.run_id,
                                   ws_urls=settings.ws_rpc_urls)


# Backends register how to build their coordinator source from the settings:
# "tcp" (COORDINATOR_ADDRESS), "solana" (RPC and WS_RPC, with RPC_2 / WS_RPC_2, then
# RPC_3 / WS_RPC_3, as fallbacks).
COORDINATOR_SOURCES: dict[str, Callable[[RunManagerSettings], CoordinatorSource]] = {
    "tcp": _tcp_source,
    "solana": _solana_source,
}


def make_coordinator_source(
    settings: RunManagerSettings, pinned_version: str | None
) -> CoordinatorSource:
    if pinned_version is not None:
        return PinnedVersionSource(pinned_version)
    factory = COORDINATOR_SOURCES.get(settings.backend)
    if factory is None:
        raise SourceUnavailable(
            f"this run-manager cannot yet ask a {settings.backend} coordinator for the client "
            "version; pass --client-version VERSION to run that image"
        )
    return factory(settings)


def make_join_check(settings: RunManagerSettings, coordinator: CoordinatorSource,
                    pinned_version: str | None) -> JoinCheck | None:
    """What the supervisor asks before each start: on Solana, Psyche's can-join for the
    wallet (through AUTHORIZER); on TCP, whether the run has finished (the coordinator
    refuses a client at join, and the client exits 11). None: nothing to ask."""
    if settings.backend == "solana":
        wallet = settings.wallet_bytes()
        if wallet is None:
            return None  # the client will say it needs a wallet
        from psyche_common.wallet import keypair_public_key
        from run_manager.join_check import SolanaJoinCheck

        return SolanaJoinCheck(settings.rpc_urls, settings.run_id,
                               keypair_public_key(wallet), settings.AUTHORIZER)
    if pinned_version is not None:
        return None  # --client-version: no coordinator is asked anything
    return FinishedRunCheck(coordinator, settings.run_id)


@dataclass
class RunOptions:
    pinned_version: str | None = None
    entrypoint: str | None = None
    container_args: list[str] = field(default_factory=list)
    wallet_address: str | None = None
    env_file_variables: dict[str, str] = field(default_factory=dict)
    """Every KEY=VALUE of the env file: the container gets them all, as in Psyche."""
    local: bool = False
    """Psyche's --local: use the image on this machine, never pull it."""
    coordinator_program_id: str | None = None
    """Psyche's --coordinator-program-id; the client in the container gets it too."""
    join_authority: str | None = None
    """Psyche's --authorizer: without RUN_ID, only runs whose join authority is this key."""


def supervisor_config(settings: RunManagerSettings, options: RunOptions,
                      gpu_probe: GpuProbe | None = None) -> SupervisorConfig:
    """The supervisor's settings. GPUs (GPUS=, `gpu_probe` for auto, the host's by default)
    pick the CUDA image and, unless DATA_PARALLELISM is set, one data-parallel rank per GPU.
    Raises GpuSelectionError (a "GPUS: ..." line) for GPUs the host does not have."""
    gpus = plan_gpus(settings.gpu_setting, gpu_probe or HostGpuProbe())
    environment = settings.container_environment(options.env_file_variables)
    if not settings.data_parallelism_set:
        environment["DATA_PARALLELISM"] = str(
            default_data_parallelism(gpus, settings.TENSOR_PARALLELISM))
    ranks = int(environment.get("DATA_PARALLELISM", "1")) * settings.TENSOR_PARALLELISM
    if gpus is not None and 0 < gpus.visible < ranks:
        # The client would refuse at start and the container crash-loop: say it once here.
        raise GpuSelectionError(
            f"GPUS: DATA_PARALLELISM x TENSOR_PARALLELISM = {ranks} ranks, one GPU each, "
            f"but the client container gets {gpus.visible} GPU(s)")
    raw = settings.wallet_bytes()
    if raw is not None:
        # Psyche hands the key to the container as RAW_WALLET_PRIVATE_KEY: the container
        # cannot see the host's wallet path. A JSON array, whichever form it came in.
        environment["RAW_WALLET_PRIVATE_KEY"] = str(list(raw)).replace(" ", "")
    if options.coordinator_program_id is not None:
        environment["PSYCHE_COORDINATOR_PROGRAM_ID"] = options.coordinator_program_id
    return SupervisorConfig(
        run_id=settings.run_id,
        image_repository=settings.CLIENT_IMAGE,
        environment=environment,
        gpus=gpus,
        entrypoint=[options.entrypoint] if options.entrypoint else None,
        command=options.container_args,
        scratch_dir=settings.SCRATCH_DIR,
        max_crash_restarts=settings.MAX_CRASH_RESTARTS,
        backoff_base_s=settings.CRASH_BACKOFF_S,
        version_change_delay_s=settings.VERSION_CHANGE_DELAY_S,
        pull=not options.local,
    )


class LogLinePrinter:
    """`--no-tui`: the TUI's panels as log lines, printed when their text changes."""

    def __init__(self, dashboard: Dashboard, out: TextIO) -> None:
        self.dashboard = dashboard
        self._out = out
        self._last: dict[str, list[str]] = {}

    def on_event(self, event: SupervisorEvent) -> None:
        self.dashboard.apply_event(event)
        if isinstance(event, LogLine):
            self._print("client", event.text)
        elif isinstance(event, ContainerStarted) or not isinstance(event, LogLine):
            self._show("container", describe_container(self.dashboard.container))

    def on_change(self, part: Part) -> None:
        d = self.dashboard
        if part == "run":
            # The phase timer ticks every poll: print when anything but the timer changes.
            untimed = None if d.run is None else d.run.model_copy(update={"phase_elapsed_s": 0.0})
            self._show("run", describe_run(d.run), key=describe_run(untimed))
            self._show_coordinator_health()
            self._show("witnesses", describe_witnesses(d.run))
        if part in ("run", "training"):  # the run's end is the training's too
            self._show("training", describe_training(d.metrics, d.metrics_error, d.run))
        if part == "wallet":
            self._show("wallet", describe_wallet(d.wallet))
        if part in ("run", "training"):
            self._show("verification", describe_verification(d.run, d.metrics))

    def _show_coordinator_health(self) -> None:
        """The TUI's red line over the Run panel (COORDINATOR SILENT, PHASE OVERDUE, ...):
        printed once when it starts or its reason changes, and said when it clears."""
        d = self.dashboard
        lines = describe_coordinator_health(d.run, d.coordinator_heard, d.coordinator_error,
                                            time.monotonic())
        had_alarms = bool(self._last.get("run-alert"))
        if not lines and had_alarms:
            self._last["run-alert"] = []
            self._print("run", "coordinator heard again and keeping to its phases: "
                        "the alarms above are over")
            return
        before = self._last.get("run-alert", [])
        key = alarm_key(lines)
        self._last["run-alert"] = key
        for line, kind in zip(lines, key, strict=True):
            if kind not in before:  # an alarm that goes on is not said again
                self._print("run", line)

    def _show(self, panel: str, lines: list[str], key: list[str] | None = None) -> None:
        key = lines if key is None else key
        if self._last.get(panel) == key:
            return
        self._last[panel] = key
        for line in lines:
            self._print(panel, line)

    def _print(self, panel: str, text: str) -> None:
        print(f"[{panel}] {text}", file=self._out, flush=True)


async def run_headless(
    supervisor_factory: Callable[[Callable[[SupervisorEvent], None]], Supervisor],
    monitor_factory: Callable[[Callable[[Part], None]], Monitor],
    dashboard: Dashboard,
    out: TextIO = sys.stdout,
) -> SupervisorFinished:
    printer = LogLinePrinter(dashboard, out)
    supervisor = supervisor_factory(printer.on_event)
    monitor = monitor_factory(printer.on_change)
    printer.on_change("wallet")
    signals = StopSignals()

    def on_signal(sig: signal.Signals) -> None:
        # SIGINT, SIGTERM, SIGHUP: stop the container (SIGTERM, bounded), remove it, exit 0;
        # a second signal kills the container at once.
        if signals.count > 1:
            say(f"stopping now ({sig.name} again): killing the container")
            supervisor.hurry()
            return
        say(f"stopping… ({sig.name}): the client container, then the run-manager")
        supervisor.request_stop()

    signals.on_signal(on_signal)
    signals.install()
    stop_polling = asyncio.Event()
    polling = asyncio.create_task(monitor.run(stop_polling))
    try:
        return await supervisor.run()
    finally:
        stop_polling.set()
        # A poll in flight (a coordinator that does not answer) must not hold the exit.
        done, _ = await asyncio.wait({polling}, timeout=POLL_STOP_S)
        if not done:
            polling.cancel()
            await asyncio.wait({polling}, timeout=1.0)
        signals.remove()
