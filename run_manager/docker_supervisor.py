"""Keeps the client container alive: the run-manager's main job.

Loop (Psyche's run-manager, plus crash restarts as its train_entrypoint.sh does):
  1. ask whether this client can join the run at all (run_manager.join_check: Psyche's
     can-join; a run that has finished): if not, stop with the reason, nothing started;
  2. ask the coordinator which client version the run wants -> image `repo:tag` by the
     rule of run_manager.client_versions (`latest` is this run-manager's own version;
     `-cuda` appended when the container gets GPUs);
  3. use the local image or pull it (progress reported, the digest checked:
     run_manager.image_pull); none to be had (no such tag, the registry down): stop,
     say so, nothing started;
  4. start the container, stream its logs, wait for it to exit;
  5. exit 10 (the run wants another version): wait `version_change_delay_s`, go to 1;
     the same version exiting 10 `max_version_mismatches` times in a row cannot be cured
     by restarting (a pinned --client-version the run does not want): stop, naming the
     version the run wants (the client's `version_mismatch wanted=...` line);
     exit 11 (the coordinator refused the client for good): stop with the client's
     own "error: ..." line; exit 0: the client finished, stop;
     any other code: a crash, restart after
     backoff_base_s * 2**(n-1) seconds (capped) up to `max_crash_restarts` times in a
     row (the count resets after `healthy_uptime_s` of uptime);
  6. stop request (Ctrl+C, SIGTERM, SIGHUP, q): stop the container (SIGTERM, which the
     client in it handles: an init, docker's tini, passes it on; SIGKILL after
     `stop_timeout_s`, or at once on `hurry()`), remove it, return.
A container a killed run-manager left behind is found by its labels and removed first.
Docker calls block, so they run in worker threads; events reach `on_event` on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

import docker
from docker.models.containers import Container

from psyche_common.exit_codes import (
    CLIENT_EXIT_FINISHED,
    CLIENT_EXIT_REFUSED,
    CLIENT_EXIT_VERSION_MISMATCH,
)
from run_manager import engine
from run_manager.client_versions import own_version, resolved_tag
from run_manager.gpus import GpuPlan
from run_manager.image_pull import PullProgress
from run_manager.join_check import JoinCheck
from run_manager.sources.coordinator import (
    CoordinatorSource,
    CoordinatorUnavailable,
    PinnedVersionSource,
)
from run_manager.tracing import NO_TRACING, NoTracing

VERSION_MISMATCH_EXIT_CODE = CLIENT_EXIT_VERSION_MISMATCH
# The client's line for exit 10, in console (`version_mismatch wanted=X running=Y`) and
# JSON (`{"event": "version_mismatch", ..., "wanted": "X", ...}`) form.
_WANTED = re.compile(r'version_mismatch.*?\bwanted"?[=:]\s*"?([^"\s,}]+)')
T = TypeVar("T")


@dataclass(frozen=True)
class SupervisorConfig:
    run_id: str
    image_repository: str = "psyche-client"
    environment: dict[str, str] = field(default_factory=dict)
    gpus: GpuPlan | None = None
    """The container's GPUs (the CUDA image, a device request); None: the CPU image."""
    entrypoint: list[str] | None = None
    """Replaces the image's `psyche-client` entry point (Psyche's `--entrypoint X -- args`)."""
    command: list[str] = field(default_factory=list)
    scratch_dir: Path | None = None
    max_crash_restarts: int = 5
    backoff_base_s: float = 5.0
    backoff_max_s: float = 120.0
    healthy_uptime_s: float = 120.0
    version_change_delay_s: float = 5.0
    max_version_mismatches: int = 3
    """Exits 10 in a row with the same version before giving up (restarting cannot help)."""
    latest_version: str = field(default_factory=own_version)
    """The version a run's `latest` stands for (run_manager.client_versions)."""
    stop_timeout_s: int = 10
    pull: bool = True
    """False (Psyche's --local): run the local image, never pull one."""


# Events, in the order a run produces them.
@dataclass(frozen=True)
class StaleContainerRemoved:
    container_id: str


@dataclass(frozen=True)
class ImagePull:
    progress: PullProgress


@dataclass(frozen=True)
class ImagePulled:
    """The pull finished: the image now tagged `image` is the one `digest` names."""

    image: str
    digest: str


@dataclass(frozen=True)
class ContainerStarted:
    container_id: str
    image: str
    version: str
    restarts: int


@dataclass(frozen=True)
class LogLine:
    text: str


@dataclass(frozen=True)
class ContainerExited:
    exit_code: int
    uptime_s: float


@dataclass(frozen=True)
class RestartScheduled:
    reason: Literal["version-change", "crash", "requested"]
    delay_s: float
    crash_restarts: int


FinishReason = Literal[
    "stopped", "client-finished", "run-finished",  # done: the run-manager exits 0
    "not-authorized", "refused", "no-image", "version-mismatch",  # final: restarting cannot help
    "gave-up", "error",
]


@dataclass(frozen=True)
class SupervisorFinished:
    reason: FinishReason
    message: str

    @property
    def failed(self) -> bool:
        """The run-manager could not run the client as asked (it exits non-zero)."""
        return self.reason not in ("stopped", "client-finished", "run-finished")


SupervisorEvent = (
    StaleContainerRemoved | ImagePull | ImagePulled | ContainerStarted | LogLine | ContainerExited
    | RestartScheduled | SupervisorFinished
)  # fmt: skip


class Supervisor:
    """Runs one run's client container until told to stop or it cannot go on."""

    def __init__(
        self,
        client: docker.DockerClient,
        coordinator: CoordinatorSource,
        config: SupervisorConfig,
        on_event: Callable[[SupervisorEvent], None],
        join_check: JoinCheck | None = None,
    ) -> None:
        self._client = client
        self._coordinator = coordinator
        self._config = config
        self._on_event = on_event
        self._join_check = join_check
        self.last_error_line = ""  # the client's last "error: ..." line, why it refused
        self.wanted_version = ""  # the version the client last said the run wants (exit 10)
        self._mismatches: tuple[str, int] = ("", 0)  # (version started, exits 10 in a row)
        self._stop = asyncio.Event()
        self._restart = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.restarts = 0
        self.crash_restarts = 0
        self.container: Container | None = None
        self.tracing: NoTracing = NO_TRACING  # spans of pulls, starts and stops (run_manager.tracing)

    def request_stop(self) -> None:
        """Stops the container and ends `run`. Safe from any thread or a signal handler."""
        self._threadsafe(self._stop.set)

    def request_restart(self) -> None:
        """Restarts the container now (not counted as a crash)."""
        self._threadsafe(self._restart.set)

    def hurry(self) -> None:
        """Stops without waiting: the running container is killed now (a second signal).
        Safe from any thread or a signal handler."""
        def kill() -> None:
            self._stop.set()
            container = self.container
            if container is not None:
                threading.Thread(target=engine.kill_container, args=(container,),
                                 name="container-kill", daemon=True).start()

        self._threadsafe(kill)

    def _threadsafe(self, action: Callable[[], None]) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(action)
        else:
            action()

    async def run(self) -> SupervisorFinished:
        self._loop = asyncio.get_running_loop()
        try:
            finished = await self._supervise()
        except (engine.EngineError, CoordinatorUnavailable) as error:
            finished = SupervisorFinished("error", str(error))
        finally:
            if self.container is not None:  # an error or cancellation mid-run: leave nothing behind
                await asyncio.to_thread(self._stop_and_remove, self.container)
                self.container = None
        self._on_event(finished)
        return finished

    async def _supervise(self) -> SupervisorFinished:
        # Asked first: a client that cannot join gets no container, and no engine call.
        if (refused := await self._refusal()) is not None:
            return refused
        for stale in await asyncio.to_thread(
            engine.find_managed_containers, self._client, self._config.run_id
        ):
            await asyncio.to_thread(engine.remove_container, stale)
            self._on_event(StaleContainerRemoved(stale.id or ""))
        while not self._stop.is_set():
            version = await self._unless_stopped(self._coordinator.client_version())
            if version is None:
                break
            image = self.image(version)
            try:
                with self.tracing.pull(image, self._config.pull) as span:
                    digest = await asyncio.to_thread(engine.ensure_image, self._client, image,
                                                     self._report_pull, pull=self._config.pull)
                    span.set_attribute("psyche.digest", digest or "")
            except engine.ImageUnavailableError as error:
                return SupervisorFinished(
                    "no-image", f"the run wants client version {version}, and its image "
                    f"cannot be had: {error}")
            if digest is not None:
                self._on_event(ImagePulled(image, digest))
            if self._stop.is_set():
                break
            exit_code, uptime_s = await self._run_once(image, version)
            if self._stop.is_set():
                break
            if self._restart.is_set():
                self._restart.clear()
                self.restarts += 1
                self._on_event(RestartScheduled("requested", 0.0, self.crash_restarts))
                continue
            if (final := self._final_exit(exit_code)) is not None:
                return final
            if exit_code == CLIENT_EXIT_VERSION_MISMATCH:
                if (stuck := self._count_mismatch(version)) is not None:
                    return stuck
                delay = self._config.version_change_delay_s
                self._on_event(RestartScheduled("version-change", delay, self.crash_restarts))
            else:
                if uptime_s >= self._config.healthy_uptime_s:
                    self.crash_restarts = 0  # it ran long enough: a fresh crash, not a crash loop
                if self.crash_restarts >= self._config.max_crash_restarts:
                    return SupervisorFinished(
                        "gave-up",
                        f"the client crashed (exit code {exit_code}) "
                        f"{self.crash_restarts + 1} times in a row; giving up",
                    )
                self.crash_restarts += 1
                delay = min(
                    self._config.backoff_max_s,
                    self._config.backoff_base_s * 2 ** (self.crash_restarts - 1),
                )
                self._on_event(RestartScheduled("crash", delay, self.crash_restarts))
            self.restarts += 1
            if await self._sleep_unless_stopped(delay):
                break
            if (refused := await self._refusal()) is not None:
                return refused  # e.g. the authorization was revoked, or the run finished
        return SupervisorFinished("stopped", "stopped on request; container removed")

    async def _refusal(self) -> SupervisorFinished | None:
        if self._join_check is None:
            return None
        refusal = await self._unless_stopped(self._join_check.refusal())
        return None if refusal is None else SupervisorFinished(refusal.reason, refusal.message)

    def _final_exit(self, exit_code: int) -> SupervisorFinished | None:
        """The end an exit code means (the client finished, or was refused for good), or
        None: the supervisor restarts the client."""
        if exit_code == CLIENT_EXIT_FINISHED:
            return SupervisorFinished("client-finished", "the client exited normally (code 0)")
        if exit_code == CLIENT_EXIT_REFUSED:
            why = self.last_error_line or "see the client's log"
            return SupervisorFinished("refused", f"the coordinator refused this client for good "
                                      f"(exit {exit_code}), so it is not restarted: {why}")
        return None

    def _count_mismatch(self, version: str) -> SupervisorFinished | None:
        """Counts an exit 10 of `version`; the end once the same version has mismatched
        `max_version_mismatches` times in a row (a new version resets the count)."""
        last, count = self._mismatches
        count = count + 1 if last == version else 1
        self._mismatches = (version, count)
        if count < self._config.max_version_mismatches:
            return None
        wanted = self.wanted_version or "another version (see the client's log)"
        if isinstance(self._coordinator, PinnedVersionSource):
            todo = (f"drop --client-version (the run-manager then runs the version the run "
                    f"names) or pass --client-version {self.wanted_version or 'VERSION'}")
        else:
            todo = (f"make {self.image(self.wanted_version or 'VERSION')} available (build it, "
                    "or publish it with scripts/publish_client_image.sh; docs/operators.md)")
        return SupervisorFinished(
            "version-mismatch",
            f"the run wants client version {wanted}, but the client started as version "
            f"{version} ({self.image(version)}) exited 10 (version mismatch) {count} times in "
            f"a row; not restarting it: {todo}")

    async def _run_once(self, image: str, version: str) -> tuple[int, float]:
        """Starts one container and waits for it to exit, a stop or a restart request."""
        spec = self.container_spec(version)
        self._restart.clear()  # any restart asked before this start is served by it
        with self.tracing.start(image, version, self.restarts) as span:
            container = await asyncio.to_thread(engine.start_container, self._client, spec)
            span.set_attribute("psyche.container_id", container.id or "")
        self.container = container
        started = time.monotonic()
        self._on_event(ContainerStarted(container.id or "", image, version, self.restarts))
        log_thread = engine.follow_logs(container, self._report_log_line)
        exited = asyncio.ensure_future(asyncio.to_thread(engine.wait_exit_code, container))
        interrupts = [asyncio.ensure_future(e.wait()) for e in (self._stop, self._restart)]
        await asyncio.wait([exited, *interrupts], return_when=asyncio.FIRST_COMPLETED)
        for task in interrupts:
            task.cancel()
        if not exited.done():  # stop or restart asked: the container is still running
            with self.tracing.stop(container.id or "", "stop", self._config.stop_timeout_s):
                await asyncio.to_thread(engine.stop_container, container,
                                        self._config.stop_timeout_s)
        exit_code = await exited
        uptime_s = time.monotonic() - started
        await asyncio.to_thread(log_thread.join, 5.0)
        self._on_event(ContainerExited(exit_code, uptime_s))
        await asyncio.to_thread(engine.remove_container, container)
        self.container = None
        return exit_code, uptime_s

    def image(self, version: str) -> str:
        """The image of a client version: REPO:TAG, the tag by run_manager.client_versions'
        rule (`latest`: this run-manager's version; `-cuda` with GPUs)."""
        tag = resolved_tag(version, self._config.gpus, self._config.latest_version)
        return f"{self._config.image_repository}:{tag}"

    def container_spec(self, version: str) -> engine.ContainerSpec:
        """How the client container of `version` is created (image, env, labels, GPUs)."""
        return engine.ContainerSpec(
            image=self.image(version),
            name=container_name(self._config.run_id),
            environment={**self._config.environment, "CLIENT_VERSION": version},
            labels={
                engine.MANAGED_BY_LABEL: engine.MANAGED_BY_VALUE,
                engine.RUN_ID_LABEL: self._config.run_id,
                engine.CLIENT_VERSION_LABEL: version,
                "io.psyche.run-manager-pid": str(os.getpid()),
            },
            gpus=self._config.gpus is not None,
            gpu_device_ids=None if self._config.gpus is None else self._config.gpus.device_ids,
            entrypoint=self._config.entrypoint,
            command=self._config.command,
            scratch_dir=self._config.scratch_dir,
        )

    def _stop_and_remove(self, container: Container) -> None:
        with self.tracing.stop(container.id or "", "cleanup", self._config.stop_timeout_s):
            engine.stop_container(container, self._config.stop_timeout_s)
        engine.remove_container(container)

    async def _unless_stopped(self, waiting: Awaitable[T]) -> T | None:
        """`waiting`'s result, or None (and `waiting` cancelled) once a stop is requested:
        a coordinator that does not answer must not hold the stop."""
        task = asyncio.ensure_future(waiting)
        stopped = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None
        return task.result()

    async def _sleep_unless_stopped(self, delay_s: float) -> bool:
        """Sleeps `delay_s`, cut short by a restart request; True when a stop request came."""
        wakers = [asyncio.ensure_future(e.wait()) for e in (self._stop, self._restart)]
        await asyncio.wait(wakers, timeout=delay_s, return_when=asyncio.FIRST_COMPLETED)
        for task in wakers:
            task.cancel()
        self._restart.clear()  # a restart asked during the wait is this restart
        return self._stop.is_set()

    def _report_pull(self, progress: PullProgress) -> None:
        self._emit_threadsafe(ImagePull(progress))

    def _report_log_line(self, text: str) -> None:
        if text.startswith("error:"):
            self.last_error_line = text
        if (wanted := _WANTED.search(text)) is not None:
            self.wanted_version = wanted.group(1)
        self._emit_threadsafe(LogLine(text))

    def _emit_threadsafe(self, event: SupervisorEvent) -> None:
        # Called from worker threads: hand the event to the loop's thread.
        if self._loop is not None and not self._loop.is_closed():
            # RuntimeError: the loop closed between the check and the call: nobody listens
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._on_event, event)


def container_name(run_id: str) -> str:
    """A container name from the run id (Docker allows [a-zA-Z0-9][a-zA-Z0-9_.-]*)."""
    return "psyche-client-" + re.sub(r"[^a-zA-Z0-9_.-]", "-", run_id)
