"""Pulling the client image for real: a registry on loopback (Debian's docker-registry),
images published to it by version with scripts/publish_client_image.sh, and the
run-manager pulling the version the run wants through a real Docker engine.

Each published image is removed from the engine before the run-manager runs, so every
pull here downloads and unpacks a layer (local_registry.py: small stand-in images that
print their CLIENT_VERSION and exit with the code the test needs).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from run_manager import engine
from run_manager.docker_supervisor import (
    ContainerExited,
    ContainerStarted,
    ImagePull,
    ImagePulled,
    LogLine,
    RestartScheduled,
    Supervisor,
    SupervisorConfig,
    SupervisorEvent,
)
from run_manager.sources import PinnedVersionSource
from run_manager.tui.app import RunManagerApp
from run_manager.tui.widgets import ContainerPanel
from run_manager.view import Dashboard
from tests.run_manager.local_registry import (
    REGISTRY_BINARY,
    TINY_BASE,
    LocalRegistry,
    free_port,
    publish_tiny_client,
    remove_images,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_containers")]

REPO_ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "psyche-client"
Publish = Callable[[str, int], str]


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory,
             docker_client: docker.DockerClient) -> Iterator[LocalRegistry]:
    if not REGISTRY_BINARY.exists():
        pytest.fail(f"{REGISTRY_BINARY} is missing: install Debian's docker-registry "
                    "(./install.sh --dev --docker does)", pytrace=False)
    local = LocalRegistry(tmp_path_factory.mktemp("registry"))
    local.start()
    yield local
    local.stop()
    remove_images(docker_client, TINY_BASE)


@pytest.fixture
def publish(docker_client: docker.DockerClient, registry: LocalRegistry,
            tmp_path: Path) -> Iterator[Publish]:
    """publish(version, exit_code): builds a stand-in client, publishes it with the
    script, removes it from the engine; returns the digest the script printed."""
    published: list[str] = []

    def publish(version: str, exit_code: int) -> str:
        reference, digest = publish_tiny_client(
            docker_client, registry, tmp_path, f"psyche-registry-test:{version}",
            exit_code=exit_code)
        assert reference == f"{registry.address}/{REPOSITORY}:{version}"
        published.append(reference)  # pulled by the run-manager later: removed at the end
        return digest

    yield publish
    remove_images(docker_client, *published)


def config(registry_address: str, run_id: str) -> SupervisorConfig:
    return SupervisorConfig(
        run_id=run_id, image_repository=f"{registry_address}/{REPOSITORY}",
        environment={"RUN_ID": run_id}, version_change_delay_s=0.1, stop_timeout_s=2,
        max_crash_restarts=0,
    )  # fmt: skip


def fractions(events: list[SupervisorEvent]) -> list[float]:
    return [e.progress.fraction for e in events
            if isinstance(e, ImagePull) and e.progress.fraction is not None]


async def test_the_published_version_is_pulled_with_progress_and_its_digest_checked(
    docker_client: docker.DockerClient, registry: LocalRegistry, publish: Publish, run_id: str,
) -> None:  # fmt: skip
    version = f"1.0.0-{run_id}"
    digest = publish(version, 0)
    assert digest == registry.manifest_digest(REPOSITORY, version)
    events: list[SupervisorEvent] = []
    supervisor = Supervisor(docker_client, PinnedVersionSource(version),
                            config(registry.address, run_id), events.append)
    finished = await asyncio.wait_for(supervisor.run(), timeout=120)
    assert finished.reason == "client-finished", finished.message
    seen = fractions(events)
    assert any(0 < f < 1 for f in seen) and seen[-1] == 1.0, seen
    assert seen == sorted(seen)  # one bar that only moves forward
    image = f"{registry.address}/{REPOSITORY}:{version}"
    assert ImagePulled(image, digest) in events
    assert f"{registry.address}/{REPOSITORY}@{digest}" in docker_client.images.get(image).attrs["RepoDigests"]
    assert LogLine(f"client {version}") in events  # the pulled image is the one that ran


async def test_a_new_version_mid_run_is_pulled_and_the_client_restarted_on_it(
    docker_client: docker.DockerClient, registry: LocalRegistry, publish: Publish, run_id: str,
) -> None:  # fmt: skip
    old, new = f"1.0.0-{run_id}", f"1.1.0-{run_id}"
    digests = {old: publish(old, 10), new: publish(new, 0)}  # the old one exits 10: mismatch
    source = PinnedVersionSource(old)
    events: list[SupervisorEvent] = []

    def on_event(event: SupervisorEvent) -> None:
        events.append(event)
        if isinstance(event, ContainerExited) and event.exit_code == 10:
            source.pin(new)  # the coordinator now wants the new version

    supervisor = Supervisor(docker_client, source, config(registry.address, run_id), on_event)
    finished = await asyncio.wait_for(supervisor.run(), timeout=120)
    assert finished.reason == "client-finished", finished.message
    pulled = [e for e in events if isinstance(e, ImagePulled)]
    assert [(e.image.rpartition(":")[2], e.digest) for e in pulled] == list(digests.items())
    assert [e.version for e in events if isinstance(e, ContainerStarted)] == [old, new]
    assert [e.reason for e in events if isinstance(e, RestartScheduled)] == ["version-change"]
    assert [e.exit_code for e in events if isinstance(e, ContainerExited)] == [10, 0]


async def test_a_missing_tag_mid_run_is_one_line_naming_it_and_nothing_is_left_started(
    docker_client: docker.DockerClient, registry: LocalRegistry, publish: Publish, run_id: str,
) -> None:  # fmt: skip
    old, missing = f"1.0.0-{run_id}", f"9.9.9-{run_id}"
    publish(old, 10)
    source = PinnedVersionSource(old)
    events: list[SupervisorEvent] = []

    def on_event(event: SupervisorEvent) -> None:
        events.append(event)
        if isinstance(event, ContainerExited):
            source.pin(missing)  # never published

    supervisor = Supervisor(docker_client, source, config(registry.address, run_id), on_event)
    finished = await asyncio.wait_for(supervisor.run(), timeout=120)
    assert finished.reason == "no-image" and finished.failed
    assert "\n" not in finished.message
    assert f"the registry {registry.address} has no tag {missing} of {REPOSITORY}" in finished.message
    assert [e.version for e in events if isinstance(e, ContainerStarted)] == [old]
    assert engine.find_managed_containers(docker_client, run_id) == []
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(f"{registry.address}/{REPOSITORY}:{missing}")


def run_manager_no_tui(tmp_path: Path, run_id: str, client_image: str,
                       version: str) -> subprocess.CompletedProcess[str]:
    env_file = tmp_path / "run.env"
    env_file.write_text(  # --client-version: no coordinator is asked
        f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS=127.0.0.1:{free_port()}\nGPUS=none\n"
        f"CLIENT_IMAGE={client_image}\nMETRICS_LOCAL_PORT={free_port()}\n")
    argv = [sys.executable, "-c", "from run_manager.cli import main; main()",
            "--env-file", str(env_file), "--no-tui", "--client-version", version]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                          cwd=REPO_ROOT)


def test_no_tui_prints_the_pull_progress_and_the_verified_digest(
    registry: LocalRegistry, publish: Publish, run_id: str, tmp_path: Path,
) -> None:  # fmt: skip
    version = f"1.0.0-{run_id}"
    digest = publish(version, 0)
    image = f"{registry.address}/{REPOSITORY}"
    result = run_manager_no_tui(tmp_path, run_id, image, version)
    assert result.returncode == 0, result.stdout + result.stderr
    percents = [int(p) for p in re.findall(
        rf"^\[container\] container {re.escape(image)}:{version}: pulling (\d+)%$",
        result.stdout, re.MULTILINE)]
    assert any(0 < p < 100 for p in percents) and percents[-1] == 100, result.stdout
    assert f"[container] pulled {image}:{version}: digest {digest} verified" in result.stdout
    assert f"[client] client {version}" in result.stdout


def test_a_registry_that_is_down_is_one_line_naming_it(run_id: str, tmp_path: Path) -> None:
    down = f"127.0.0.1:{free_port()}"  # nothing listens there
    result = run_manager_no_tui(tmp_path, run_id, f"{down}/{REPOSITORY}", "1.0.0")
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("run-manager:")]
    assert f"the registry {down} does not answer" in error
    assert ": running" not in result.stdout  # no container started (no_leftover_containers)


async def test_the_tui_shows_the_pull_as_a_progress_bar(
    docker_client: docker.DockerClient, registry: LocalRegistry, publish: Publish, run_id: str,
) -> None:  # fmt: skip
    version = f"1.0.0-{run_id}"
    publish(version, 0)
    app = RunManagerApp(Dashboard(), lambda on_event: Supervisor(
        docker_client, PinnedVersionSource(version), config(registry.address, run_id), on_event))
    bar_states: list[tuple[float, float | None, bool]] = []
    async with app.run_test(size=(120, 40)) as pilot:
        bar = app.query_one(ContainerPanel).pull
        app.watch(bar, "progress", lambda progress: bar_states.append(
            (progress, bar.total, bar.display)), init=False)
        for _ in range(600):  # 60 s at most
            if app.finished is not None:
                break
            await pilot.pause(0.1)
        assert app.finished is not None and app.finished.reason == "client-finished"
        assert not bar.display  # shown only while pulling
        await pilot.press("q")
    assert bar_states, "the bar never moved"
    assert any(0 < p < (t or 0) for p, t, _ in bar_states), bar_states
    assert all(shown for _, _, shown in bar_states)
    assert bar_states[-1][0] == bar_states[-1][1]  # it reached its end
