"""A run's client version and the image the run-manager runs for it (docs/operators.md,
"Client versions and images"), as an operator meets it: `run-manager --env-file run.env
--no-tui` against a real `psyche-coordinator run` (TCP) through the real Docker engine.

  - a run that leaves `client_version` unset (`latest`) runs CLIENT_IMAGE:<the
    run-manager's own version>, the tag scripts/publish_client_image.sh publishes by
    default: pulled from a registry on loopback (a small stand-in image,
    local_registry.py), the container told CLIENT_VERSION=latest;
  - `--client-version V` on a run that wants another version: the real client exits 10
    (version mismatch); the run-manager stops after three such exits in a row with one
    line naming the version the run wants and what to do, instead of restarting forever.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import tcp_run
import tomli_w
from loopback import free_port
from processes import stop_process
from tcp_run import TESTNET

from run_manager import engine
from run_manager.client_versions import LATEST, own_version, resolved_tag
from run_manager.gpus import GpuPlan
from tests.run_manager.local_registry import LocalRegistry, publish_tiny_client

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_containers")]

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_MANAGER = [sys.executable, "-c", "from run_manager.cli import main; main()"]


def test_latest_names_the_run_managers_own_version_and_others_name_themselves() -> None:
    assert own_version() == tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())[
        "project"]["version"]
    assert resolved_tag(LATEST, None, "0.1.0") == "0.1.0"
    assert resolved_tag(LATEST, GpuPlan(None, 1), "0.1.0") == "0.1.0-cuda"
    assert resolved_tag("2.3.4", None, "0.1.0") == "2.3.4"
    assert resolved_tag("2.3.4", GpuPlan(None, 1), "0.1.0") == "2.3.4-cuda"


@pytest.fixture
def coordinator(tmp_path: Path, run_id: str) -> Iterator[str]:
    """A TCP coordinator whose state.toml leaves client_version unset; its address."""
    port, data_port = free_port(), free_port()
    state = tcp_run.testnet_state(data_port=data_port, run_id=run_id)
    del state["client_version"]  # the default an operator gets: `latest`
    (tmp_path / "state.toml").write_text(tomli_w.dumps(state))
    data = tomllib.loads((TESTNET / "data.toml").read_text())
    data["dir"] = str((TESTNET / data["dir"]).resolve())
    (tmp_path / "data.toml").write_text(tomli_w.dumps(data))
    with (tmp_path / "coordinator.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "coordinator_tcp", "run", "--state", "state.toml",
             "--data-config", "data.toml", "--server-port", str(port), "--bind-host",
             "127.0.0.1", "--tick-interval", "0.2"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(process)


def run_manager(tmp_path: Path, env: str, *args: str, timeout_s: float) -> tuple[int, str]:
    env_file = tmp_path / "run.env"
    env_file.write_text(env + "GPUS=none\nIROH_RELAY=disabled\nTORCH_THREADS=1\n"
                        "VERSION_CHANGE_DELAY_S=0.5\nCOORDINATOR_WAIT_S=60\n"
                        f"METRICS_LOCAL_PORT={free_port()}\n")
    result = subprocess.run([*RUN_MANAGER, "--env-file", str(env_file), "--no-tui", *args],
                            capture_output=True, text=True, timeout=timeout_s, cwd=tmp_path,
                            check=False)
    return result.returncode, result.stdout + result.stderr


def test_a_latest_run_pulls_the_run_managers_own_version_from_the_registry(
    docker_client: docker.DockerClient, loopback_registry: LocalRegistry, coordinator: str,
    tmp_path: Path, run_id: str,
) -> None:  # fmt: skip
    # removed from the engine once published: the run-manager must pull it
    published, digest = publish_tiny_client(docker_client, loopback_registry, tmp_path,
                                            f"psyche-version-rule-test:{own_version()}")
    code, output = run_manager(
        tmp_path, f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS={coordinator}\n"
        f"CLIENT_IMAGE={loopback_registry.address}/psyche-client\n", timeout_s=180)
    assert code == 0, output
    assert f"[container] pulled {published}: digest {digest} verified" in output, output
    assert "[client] client latest" in output, output  # CLIENT_VERSION is the run's word
    assert "the client exited normally" in output, output


def test_a_pinned_version_the_run_does_not_want_stops_after_three_mismatches(
    client_image: str, coordinator: str, tmp_path: Path, run_id: str,
    docker_client: docker.DockerClient,
) -> None:  # fmt: skip
    pinned = client_image.rpartition(":")[2]
    code, output = run_manager(
        tmp_path, f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS={coordinator}\n",
        "--client-version", pinned, timeout_s=400)
    assert code == 1, output
    assert output.count(f"version_mismatch wanted=latest running={pinned}") == 3, output
    assert output.count("exited (10)") == 3, output
    # One line, the run-manager's last, says why it stopped and what to do.
    last = output.strip().splitlines()[-1]
    assert last.startswith("run-manager: the run wants client version latest, but the client "
                           f"started as version {pinned} ({client_image})"), output
    assert "not restarting it" in last, last
    assert "drop --client-version" in last and "--client-version latest" in last, last
    assert engine.find_managed_containers(docker_client, run_id) == []
