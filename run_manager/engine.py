"""The Docker engine, as the supervisor uses it (docker-py against /var/run/docker.sock).

Each function turns the engine's failures into an EngineError whose message tells the
operator what to do: no engine, an image that is neither local nor pullable, GPUs
requested without the NVIDIA Container Toolkit.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import DeviceRequest, Mount

from run_manager.gpus import CUDA_TAG_SUFFIX
from run_manager.image_pull import PullProgress, PullTracker, why_unpullable

MANAGED_BY_LABEL = "io.psyche.managed-by"
MANAGED_BY_VALUE = "run-manager"
RUN_ID_LABEL = "io.psyche.run-id"
CLIENT_VERSION_LABEL = "io.psyche.client-version"

NVIDIA_TOOLKIT_MESSAGE = (
    "GPUs were requested but Docker cannot give them to the container "
    '(engine: could not select device driver "" with capabilities: [[gpu]]). '
    "Install the NVIDIA Container Toolkit "
    "(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/install-guide.html), "
    "run `sudo nvidia-ctk runtime configure --runtime=docker` and restart Docker; "
    "or set GPUS=none to train on the CPU."
)


class EngineError(Exception):
    """The engine refused or failed; the message is meant for the operator."""


class ImageUnavailableError(EngineError):
    pass


class GpuUnavailableError(EngineError):
    pass


@dataclass(frozen=True)
class ContainerSpec:
    """How to run one client container."""

    image: str
    name: str
    environment: dict[str, str]
    labels: dict[str, str]
    gpus: bool = False
    gpu_device_ids: tuple[str, ...] | None = None
    """With `gpus`: these GPUs (nvidia-smi indices); None: every GPU of the host."""
    entrypoint: list[str] | None = None
    command: list[str] = field(default_factory=list)
    scratch_dir: Path | None = None


def connect(timeout_s: float = 30.0) -> docker.DockerClient:
    """A client of the local engine, checked with a ping."""
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except docker.errors.DockerException as error:
        raise EngineError(
            f"cannot reach the Docker engine ({error}). Is dockerd running? "
            "Start it with `sudo scripts/docker_engine.sh start`."
        ) from None
    return client


def split_image(image: str) -> tuple[str, str]:
    """`repo[:tag]` -> (repo, tag); a ':' inside a registry host:port is not a tag."""
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        return image, "latest"
    return repository, tag


def ensure_image(
    client: docker.DockerClient,
    image: str,
    on_progress: Callable[[PullProgress], None] | None = None,
    *,
    pull: bool = True,
) -> str | None:
    """Uses the local image when there is one (returns None); pulls it otherwise (unless
    `pull` is False, Psyche's --local), reporting progress, and returns the digest the
    registry served once the pulled image is checked to carry it."""
    try:
        client.images.get(image)
        return None
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as error:
        raise EngineError(f"cannot inspect image {image}: {error.explanation}") from None
    if not pull:
        raise ImageUnavailableError(
            f"image {image} is not on this machine and --local forbids pulling it: build it "
            f"({_build_command(image)}) or drop --local{_cpu_hint(image)}")
    repository, tag = split_image(image)
    tracker = PullTracker(image)
    try:
        # The low-level API streams progress; the generator must be consumed to the end
        # or the engine cancels the pull.
        stream: Iterator[dict[str, Any]] = client.api.pull(repository, tag=tag, stream=True, decode=True)
        for event in stream:
            if "error" in event:
                raise ImageUnavailableError(_unpullable(image, str(event["error"])))
            progress = tracker.feed(event)
            if on_progress is not None:
                on_progress(progress)
    except docker.errors.APIError as error:
        raise ImageUnavailableError(_unpullable(image, str(error.explanation or error))) from None
    return _verified_digest(client, image, repository, tracker.digest)


def _verified_digest(client: docker.DockerClient, image: str, repository: str,
                     digest: str | None) -> str:
    """The digest the registry announced, once the image now tagged `image` is checked
    to be the one it names (its RepoDigests); the engine checked each layer's content."""
    try:
        pulled = client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ImageUnavailableError(_unavailable(image, "the pull finished without it")) from None
    if digest is None:
        raise ImageUnavailableError(_unavailable(image, "the registry named no digest"))
    repo_digests = pulled.attrs.get("RepoDigests") or []
    if f"{repository}@{digest}" not in repo_digests:
        raise ImageUnavailableError(
            f"image {image}: the registry served digest {digest}, but the image now tagged "
            f"{image} has {', '.join(repo_digests) or 'none'}; not running it")
    return digest


def _unpullable(image: str, reason: str) -> str:
    repository, tag = split_image(image)
    return (f"image {image} is not on this machine and cannot be pulled: "
            f"{why_unpullable(repository, tag, reason)}{_cpu_hint(image)}")


def _unavailable(image: str, reason: str) -> str:
    return (
        f"image {image} is not on this machine and cannot be pulled ({reason.strip()}). "
        "Check CLIENT_IMAGE and the version the run wants, your network and registry login, "
        f"or build it locally with {_build_command(image)}.{_cpu_hint(image)}"
    )


def _build_command(image: str) -> str:
    cuda = split_image(image)[1].endswith(CUDA_TAG_SUFFIX)
    return "scripts/build_client_image.sh" + (" --cuda" if cuda else "")


def _cpu_hint(image: str) -> str:
    if split_image(image)[1].endswith(CUDA_TAG_SUFFIX):
        return " (the CUDA image, as the container gets GPUs; GPUS=none runs the CPU one)"
    return ""


def gpu_device_requests(spec: ContainerSpec) -> list[DeviceRequest] | None:
    """What `docker run --gpus all` (or `--gpus '"device=0,1"'`) sends: the engine hands
    the request to the driver registered for the "gpu" capability (the NVIDIA Container
    Toolkit's); the driver name stays empty, as the docker CLI leaves it."""
    if not spec.gpus:
        return None
    if spec.gpu_device_ids is None:
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return [DeviceRequest(device_ids=list(spec.gpu_device_ids), capabilities=[["gpu"]])]


def create_container(client: docker.DockerClient, spec: ContainerSpec) -> Container:
    """Creates (does not start) the client container: host network, 1 GiB /dev/shm, the
    env, labels to find it again, and the GPUs through a device request when asked."""
    mounts = []
    if spec.scratch_dir is not None:
        mounts.append(Mount(target="/scratch", source=str(spec.scratch_dir), type="bind"))
    try:
        container: Container = client.containers.create(
            spec.image,
            command=spec.command or None,
            entrypoint=spec.entrypoint,
            name=spec.name,
            environment=spec.environment,
            labels=spec.labels,
            network_mode="host",
            shm_size="1g",
            # An init (docker's tini) is PID 1: it passes `docker stop`'s SIGTERM to the
            # client, which stops cleanly (exit 0; 143 if it had not yet taken the
            # signal), and reaps the client's rank processes.
            init=True,
            device_requests=gpu_device_requests(spec),
            mounts=mounts,
        )
    except docker.errors.ImageNotFound:
        raise ImageUnavailableError(_unavailable(spec.image, "not found at create")) from None
    except docker.errors.APIError as error:
        raise EngineError(f"cannot create container from {spec.image}: {error.explanation}") from None
    return container


def start_container(client: docker.DockerClient, spec: ContainerSpec) -> Container:
    """Creates and starts the client container (create_container); a container that
    cannot start is removed, and GPUs the engine cannot give become the toolkit message."""
    container = create_container(client, spec)
    try:
        container.start()
    except docker.errors.APIError as error:
        # A container that failed to start stays "created": remove it so no trace is left.
        remove_container(container)
        explanation = str(error.explanation or error)
        if re.search(r"could not select device driver .* capabilities", explanation):
            raise GpuUnavailableError(NVIDIA_TOOLKIT_MESSAGE) from None
        raise EngineError(f"cannot start container from {spec.image}: {explanation}") from None
    return container


def find_managed_containers(client: docker.DockerClient, run_id: str) -> list[Container]:
    """Containers this run's run-manager started, running or not (found by label)."""
    filters = {"label": [f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}", f"{RUN_ID_LABEL}={run_id}"]}
    result: list[Container] = client.containers.list(all=True, filters=filters)
    return result


def stop_container(container: Container, timeout_s: int = 10) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; a container already gone is fine."""
    with contextlib.suppress(docker.errors.NotFound):
        container.stop(timeout=timeout_s)


def kill_container(container: Container) -> None:
    """SIGKILL now (a stop that must not wait); a container already stopped is fine."""
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        container.kill()


def remove_container(container: Container) -> None:
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as error:
        # "removal already in progress" is the engine finishing our own earlier request.
        if "already in progress" not in str(error.explanation):
            raise EngineError(f"cannot remove container {container.short_id}: {error.explanation}") from None


def wait_exit_code(container: Container) -> int:
    """Blocks until the container stops; its exit code (-1 when it vanished)."""
    try:
        status = container.wait(condition="not-running")
    except docker.errors.NotFound:
        return -1
    return int(status.get("StatusCode", -1))


def follow_logs(
    container: Container, on_line: Callable[[str], None], name: str = "container-logs"
) -> threading.Thread:
    """Streams the container's output, line by line, from a daemon thread.

    The thread ends by itself when the container stops (the engine closes the stream).
    """

    def pump() -> None:
        pending = b""
        try:
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    on_line(line.decode("utf-8", "replace").rstrip("\r"))
        except docker.errors.DockerException:
            pass  # the container was removed under the stream: nothing more to read
        if pending:
            on_line(pending.decode("utf-8", "replace"))

    thread = threading.Thread(target=pump, name=name, daemon=True)
    thread.start()
    return thread
