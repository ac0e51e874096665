"""What the client image carries (Dockerfile.client, scripts/build_client_image.sh): the
wandb extra, so that a containerised client given `--wandb-project` (WANDB_PROJECT in a
run-manager's env file) logs to W&B instead of exiting 2 with "needs the wandb package".
The real image, run by the real engine; W&B in its offline mode (no network, no key)."""

from __future__ import annotations

import time

import docker
import pytest

pytestmark = pytest.mark.timeout(300)  # the image may be rebuilt first (the fixture)


def test_the_image_imports_wandb(docker_client: docker.DockerClient, client_image: str) -> None:
    output = docker_client.containers.run(
        client_image, entrypoint=["python", "-c", "import wandb; print(wandb.__version__)"],
        network_mode="none", remove=True)
    major = output.decode().strip().split(".")[0]
    assert major == "0", output  # pyproject's wandb extra: wandb>=0.18,<1


def test_a_containerised_client_with_wandb_project_starts_its_wandb_run(
        docker_client: docker.DockerClient, client_image: str) -> None:
    """`train --wandb-project p` in the container: the W&B run starts (offline: its files
    under the working directory), the client goes on to its coordinator (none here) and
    stops on SIGTERM with exit 0, not the 2 of a missing wandb."""
    container = docker_client.containers.run(
        client_image, ["train", "--run-id", "r", "--server-addr", "127.0.0.1:9", "--device",
                       "cpu", "--wandb-project", "image-test"],
        environment={"WANDB_MODE": "offline"}, network_mode="none", detach=True)
    try:
        deadline = time.monotonic() + 90
        logs = ""
        while "started identity=" not in logs:
            container.reload()
            logs = container.logs().decode(errors="replace")
            assert container.status != "exited", logs
            assert time.monotonic() < deadline, logs
            time.sleep(0.5)
        assert "wandb" not in logs.lower(), logs  # no complaint about W&B
        found = container.exec_run(["sh", "-c", "ls /psyche/wandb"]).output.decode()
        assert "offline-run-" in found, found
        container.stop(timeout=30)
        assert container.wait(timeout=30)["StatusCode"] == 0, container.logs().decode()
    finally:
        container.remove(force=True)
