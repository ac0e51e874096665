"""A real image registry on loopback (Debian's `docker-registry`) and small images to
publish to it, for the run-manager's pull tests.

The images are tiny on purpose: a 2 MB base (the host's /bin/sh and the C library it
needs, `docker import`ed) and, per client version, one layer of random bytes, so each
pull downloads and unpacks a layer of its own (the progress the tests watch) in well
under a second, and publishing one pushes only that layer. The real client image is
1.6 GB: pushing it to a fresh registry on every run would cost a minute of CI.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import docker
import httpx
from loopback import free_port
from processes import stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]
REGISTRY_BINARY = Path("/usr/bin/docker-registry")
TINY_BASE = "psyche-registry-test-base:1"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
# The host's shell and what it loads: enough for `sh -c 'echo ...; exit N'`.
SHELL_FILES = ("/bin/sh", "/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6",
               "/lib64/ld-linux-x86-64.so.2")


class LocalRegistry:
    """`docker-registry serve` on 127.0.0.1:<free port>, storing under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.address = f"127.0.0.1:{free_port()}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, wait_s: float = 20.0) -> None:
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'data'}\n"
            f"http:\n  addr: {self.address}\n"
        )
        log = (self.root / "registry.log").open("wb")
        self.process = subprocess.Popen([str(REGISTRY_BINARY), "serve", str(config)],
                                        stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {(self.root / 'registry.log').read_text()}")
            try:
                if httpx.get(f"http://{self.address}/v2/", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"docker-registry did not answer on {self.address} within {wait_s}s")

    def stop(self) -> None:
        stop_process(self.process)

    def manifest_digest(self, repository: str, tag: str) -> str:
        """The digest the registry itself gives `repository:tag` (its manifest's)."""
        response = httpx.head(f"http://{self.address}/v2/{repository}/manifests/{tag}",
                              headers={"Accept": MANIFEST_V2}, timeout=5.0)
        response.raise_for_status()
        return response.headers["Docker-Content-Digest"]


def ensure_tiny_base(client: docker.DockerClient) -> str:
    """The 2 MB base image (imported once per engine)."""
    try:
        client.images.get(TINY_BASE)
        return TINY_BASE
    except docker.errors.ImageNotFound:
        pass
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in SHELL_FILES:
            archive.add(os.path.realpath(path), arcname=path.lstrip("/"))
    repository, tag = TINY_BASE.split(":")
    client.api.import_image_from_data(buffer.getvalue(), repository=repository, tag=tag)
    client.images.get(TINY_BASE)  # raises if the import did not make it
    return TINY_BASE


def build_tiny_client(client: docker.DockerClient, workdir: Path, tag: str, exit_code: int,
                      payload_mb: int = 16) -> str:
    """A stand-in client image `tag`: prints its CLIENT_VERSION, then exits `exit_code`;
    its own layer holds `payload_mb` MB of random bytes (what a pull has to fetch)."""
    base = ensure_tiny_base(client)
    context = workdir / f"context-{tag.replace(':', '-').replace('/', '-')}"
    context.mkdir(parents=True)
    (context / "payload.bin").write_bytes(os.urandom(payload_mb * 1024 * 1024))
    (context / "Dockerfile").write_text(
        f"FROM {base}\nCOPY payload.bin /payload.bin\n"
        'LABEL io.psyche.test="registry pull"\n'
        f'ENTRYPOINT ["/bin/sh", "-c", "echo client $CLIENT_VERSION; exit {exit_code}"]\n'
    )
    client.images.build(path=str(context), tag=tag, rm=True)
    shutil.rmtree(context)
    return tag


def remove_images(client: docker.DockerClient, *images: str) -> None:
    """Untags (and deletes when no tag is left) each image; missing ones are fine."""
    for image in images:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(image, force=True)


def publish_tiny_client(client: docker.DockerClient, registry: LocalRegistry, workdir: Path,
                        tag: str, payload_mb: int = 16,
                        exit_code: int = 0) -> tuple[str, str]:
    """A stand-in client `tag` that exits `exit_code`, published with
    scripts/publish_client_image.sh as psyche-client:<its version> and then removed from
    the engine with what the script tagged (a run-manager must pull it): (the published
    reference, the digest the script printed)."""
    build_tiny_client(client, workdir, tag, exit_code=exit_code, payload_mb=payload_mb)
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "publish_client_image.sh"), registry.address,
         "--image", tag], capture_output=True, text=True, timeout=120, check=False)
    published = f"{registry.address}/psyche-client:{tag.rpartition(':')[2]}"
    remove_images(client, tag, published)
    assert result.returncode == 0, result.stderr
    return published, result.stdout.splitlines()[-1]
