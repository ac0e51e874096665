"""Fixtures for the run-manager tests: a real Docker engine and the real client image."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from run_manager import engine
from tests.run_manager.local_registry import (
    REGISTRY_BINARY,
    TINY_BASE,
    LocalRegistry,
    remove_images,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "psyche-base:bookworm"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: end to end through the real client image and a real TCP coordinator"
    )


def project_version() -> str:
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """The local engine. Fails (never skips) when there is none: these tests are required."""
    try:
        client = engine.connect(timeout_s=60)
    except engine.EngineError as error:
        pytest.fail(
            f"the container tests need a running Docker engine: {error}\n"
            "Start one with `sudo scripts/docker_engine.sh start` (CI: .ci/run does it).",
            pytrace=False,
        )
    yield client
    client.close()


@pytest.fixture(scope="session")
def client_image(docker_client: docker.DockerClient) -> str:
    """The real client image psyche-client:<version>, built from this checkout.

    The build script is idempotent (a no-op when the image was built from the same wheel,
    Dockerfile and assets), so the end-to-end tests always run the code under test.
    PSYCHE_REUSE_CLIENT_IMAGE=1 takes any existing image as is (faster local iterations).
    """
    image = f"psyche-client:{project_version()}"
    if os.environ.get("PSYCHE_REUSE_CLIENT_IMAGE") == "1":
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.get(image)
            return image
    for script in ("build_base_image.sh", "build_client_image.sh"):
        result = subprocess.run(
            ["bash", str(REPO_ROOT / "scripts" / script)],
            cwd=REPO_ROOT, capture_output=True, check=False, text=True, timeout=1200,
        )  # fmt: skip
        if result.returncode != 0:
            pytest.fail(f"scripts/{script} failed:\n{result.stdout}\n{result.stderr}", pytrace=False)
    docker_client.images.get(image)
    return image


@pytest.fixture
def run_id() -> str:
    """A run id of its own per test, so containers of different tests never collide."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def no_leftover_containers(docker_client: docker.DockerClient, run_id: str) -> Iterator[None]:
    """Checks the test left no container of its run behind; removes any it did."""
    yield
    leftovers = engine.find_managed_containers(docker_client, run_id)
    for container in leftovers:
        engine.remove_container(container)
    assert leftovers == [], f"containers left behind: {[c.name for c in leftovers]}"


@pytest.fixture
def loopback_registry(tmp_path: Path,
                      docker_client: docker.DockerClient) -> Iterator[LocalRegistry]:
    """A registry of the test's own on loopback (local_registry.py); afterwards stopped,
    and the stand-in images' base removed from the engine."""
    if not REGISTRY_BINARY.exists():
        pytest.fail(f"{REGISTRY_BINARY} is missing: install Debian's docker-registry "
                    "(./install.sh --dev --docker does)", pytrace=False)
    registry = LocalRegistry(tmp_path / "registry")
    registry.root.mkdir()
    registry.start()
    yield registry
    registry.stop()
    remove_images(docker_client, TINY_BASE)
