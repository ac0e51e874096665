"""Which client image a run's client version names: one rule for TCP and Solana runs.

A run names a client version (a TCP run: `client_version` in its state.toml, `latest`
when unset; a Solana run: the version given to create-run / update-config). The
run-manager runs the image CLIENT_IMAGE:TAG, TAG being:
  - the run-manager's own version (`run-manager --version`, the project version) when
    the run names `latest`: the tag scripts/build_client_image.sh builds and
    scripts/publish_client_image.sh publishes by default, so a run that leaves its
    version unset runs the client released with this run-manager;
  - the named version otherwise;
  - with `-cuda` appended when the container gets GPUs (run_manager.gpus).
The container's CLIENT_VERSION is the run's own word (`latest` stays `latest`), which
is what the client compares with the coordinator's version.
"""

from __future__ import annotations

from psyche_common.cli_conventions import package_version
from run_manager.gpus import GpuPlan, image_tag

LATEST = "latest"


def own_version() -> str:
    """This run-manager's version: what `latest` stands for. A source tree that was
    never installed has none, and `latest` then stays the literal tag."""
    found = package_version()
    return LATEST if found.startswith("unknown") else found


def resolved_tag(version: str, gpus: GpuPlan | None, latest_version: str) -> str:
    """The image tag that runs a run's client `version` (the rule above)."""
    return image_tag(latest_version if version == LATEST else version, gpus)
