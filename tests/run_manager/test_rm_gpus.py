"""GPUs for the client container: GPUS=, the CUDA image, device requests, DATA_PARALLELISM.

This machine has no GPU, so the host's GPUs are the one thing faked here (FakeGpuProbe,
and a fake driver directory / nvidia-smi for HostGpuProbe). Everything else is real:
the settings from an env file, the supervisor's container spec, and the Docker engine,
which creates the container with its device request (inspected without starting it) and
refuses to start it for want of the NVIDIA Container Toolkit.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from typer.testing import CliRunner

from run_manager import engine, runner
from run_manager.cli import app
from run_manager.docker_supervisor import Supervisor, SupervisorConfig, SupervisorEvent
from run_manager.gpus import (
    GpuPlan,
    GpuSelectionError,
    GpuSetting,
    HostGpuProbe,
    count_nvidia_smi_gpus,
    parse_gpus,
)
from run_manager.runner import RunOptions, supervisor_config
from run_manager.settings import RunManagerSettings, SettingsError, load_settings
from run_manager.sources import PinnedVersionSource

TCP = "RUN_ID=r\nCOORDINATOR_ADDRESS=127.0.0.1:20000\n"
NO_ENGINE = docker.DockerClient(version="1.41")  # never called: image and spec need no engine


@dataclass
class FakeGpuProbe:
    """Stands in for the host's NVIDIA GPUs, which this machine cannot have."""

    count: int

    def gpu_count(self) -> int:
        return self.count


def settings_from(tmp_path: Path, text: str) -> RunManagerSettings:
    env = tmp_path / "run.env"
    env.write_text(TCP + text)
    return load_settings(env)


def config_for(tmp_path: Path, text: str, gpus_on_host: int) -> SupervisorConfig:
    return supervisor_config(settings_from(tmp_path, text), RunOptions(), FakeGpuProbe(gpus_on_host))


# --- GPUS= in the env file --------------------------------------------------------------

@pytest.mark.parametrize(("value", "normalized", "setting"), [
    ("auto", "auto", GpuSetting("auto")),
    ("ALL", "all", GpuSetting("all")),
    ("none", "none", GpuSetting("none")),
    ("0", "0", GpuSetting("ids", ("0",))),
    ("0, 2,03", "0,2,3", GpuSetting("ids", ("0", "2", "3"))),
])
def test_gpus_values_parse(tmp_path: Path, value: str, normalized: str, setting: GpuSetting) -> None:
    settings = settings_from(tmp_path, f"GPUS={value}\n")
    assert (settings.GPUS, settings.gpu_setting) == (normalized, setting)


def test_gpus_defaults_to_auto(tmp_path: Path) -> None:
    assert settings_from(tmp_path, "").gpu_setting == GpuSetting("auto")


@pytest.mark.parametrize(("value", "message"), [
    ("maybe", "GPUS: must be auto, all, none or GPU indices such as 0,1 (got 'maybe')"),
    ("0,", "GPUS: must be auto, all, none or GPU indices such as 0,1 (got '0,')"),
    ("gpu0", "GPUS: must be auto, all, none or GPU indices such as 0,1 (got 'gpu0')"),
    ("-1", "GPUS: must be auto, all, none or GPU indices such as 0,1 (got '-1')"),
    ("1,0,1", "GPUS: GPU 1 listed more than once (got '1,0,1')"),
])
def test_bad_gpus_values_are_one_line_naming_gpus(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings_from(tmp_path, f"GPUS={value}\n")
    assert caught.value.problems == [message]


def test_the_cli_says_a_bad_gpus_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    env = tmp_path / "run.env"
    env.write_text(TCP + "GPUS=all,0\n")
    result = CliRunner().invoke(app, ["--env-file", str(env), "--no-tui", "--client-version", "1"])
    assert result.exit_code == 2
    assert result.output == ("run-manager: GPUS: must be auto, all, none or GPU indices such as "
                             "0,1 (got 'all,0')\n")


def test_parse_gpus_directly() -> None:
    assert parse_gpus(" None ") == GpuSetting("none")
    with pytest.raises(ValueError, match="listed more than once"):
        parse_gpus("2,2")


# --- the host's GPUs ----------------------------------------------------------------------

def test_host_probe_counts_the_driver_gpu_directories(tmp_path: Path) -> None:
    fake_gpu_proc_dir = tmp_path / "fake-nvidia-driver-gpus"  # the driver's /proc/driver/nvidia/gpus
    for bus_id in ("0000:3b:00.0", "0000:5e:00.0"):
        (fake_gpu_proc_dir / bus_id).mkdir(parents=True)
    assert HostGpuProbe(proc_dir=fake_gpu_proc_dir, nvidia_smi="no-such-nvidia-smi").gpu_count() == 2


def test_host_probe_falls_back_to_nvidia_smi(tmp_path: Path) -> None:
    fake_nvidia_smi = tmp_path / "fake-nvidia-smi"
    fake_nvidia_smi.write_text(
        "#!/bin/sh\n[ \"$1\" = -L ] || exit 9\n"
        "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0b2c)'\n"
        "echo '  MIG 3g.40gb     Device  0: (UUID: MIG-11aa)'\n"
        "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-93fe)'\n"
    )
    fake_nvidia_smi.chmod(fake_nvidia_smi.stat().st_mode | stat.S_IXUSR)
    probe = HostGpuProbe(proc_dir=tmp_path / "absent", nvidia_smi=str(fake_nvidia_smi))
    assert probe.gpu_count() == 2
    failing = tmp_path / "fake-nvidia-smi-no-driver"
    failing.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    failing.chmod(failing.stat().st_mode | stat.S_IXUSR)
    assert HostGpuProbe(proc_dir=tmp_path / "absent", nvidia_smi=str(failing)).gpu_count() == 0


def test_no_driver_and_no_nvidia_smi_is_no_gpu(tmp_path: Path) -> None:
    assert HostGpuProbe(proc_dir=tmp_path / "absent", nvidia_smi="no-such-nvidia-smi").gpu_count() == 0
    assert count_nvidia_smi_gpus("No devices were found\n") == 0


# --- image choice and DATA_PARALLELISM -------------------------------------------------

def test_without_gpus_the_cpu_image_and_one_rank(tmp_path: Path) -> None:
    config = config_for(tmp_path, "", gpus_on_host=0)
    assert config.gpus is None
    assert config.environment["DATA_PARALLELISM"] == "1"
    supervisor = Supervisor(NO_ENGINE, PinnedVersionSource("0.1.0"), config, print)
    assert supervisor.image("0.1.0") == "psyche-client:0.1.0"
    assert supervisor.container_spec("0.1.0").gpus is False


def test_with_gpus_the_cuda_image_every_gpu_and_one_rank_per_gpu(tmp_path: Path) -> None:
    config = config_for(tmp_path, "CLIENT_IMAGE=registry.example:5000/psyche-client\n",
                        gpus_on_host=4)
    assert config.gpus == GpuPlan(device_ids=None, visible=4)
    assert config.environment["DATA_PARALLELISM"] == "4"
    supervisor = Supervisor(NO_ENGINE, PinnedVersionSource("0.2.0"), config, print)
    assert supervisor.image("0.2.0") == "registry.example:5000/psyche-client:0.2.0-cuda"
    spec = supervisor.container_spec("0.2.0")
    assert (spec.gpus, spec.gpu_device_ids) == (True, None)
    assert spec.environment["CLIENT_VERSION"] == "0.2.0"  # the version, not the image tag


def test_chosen_gpus_are_requested_by_index_and_counted(tmp_path: Path) -> None:
    config = config_for(tmp_path, "GPUS=1,3\n", gpus_on_host=4)
    assert config.gpus == GpuPlan(device_ids=("1", "3"), visible=2)
    assert config.environment["DATA_PARALLELISM"] == "2"


def test_gpus_none_forces_the_cpu_on_a_gpu_host(tmp_path: Path) -> None:
    config = config_for(tmp_path, "GPUS=none\n", gpus_on_host=8)
    assert config.gpus is None
    assert config.environment["DATA_PARALLELISM"] == "1"


def test_gpus_all_requests_gpus_even_when_none_is_detected(tmp_path: Path) -> None:
    config = config_for(tmp_path, "GPUS=all\n", gpus_on_host=0)
    assert config.gpus == GpuPlan(device_ids=None, visible=0)
    assert config.environment["DATA_PARALLELISM"] == "1"  # unknown count: one rank


def test_an_explicit_data_parallelism_wins_over_the_gpu_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = config_for(tmp_path, "DATA_PARALLELISM=1\n", gpus_on_host=8)
    assert config.gpus is not None and config.gpus.visible == 8
    assert config.environment["DATA_PARALLELISM"] == "1"
    # Set in the shell rather than the file: set all the same (the shell wins, as in Psyche).
    monkeypatch.setenv("DATA_PARALLELISM", "1")
    config = config_for(tmp_path, "", gpus_on_host=8)
    assert config.environment["DATA_PARALLELISM"] == "1"


def test_more_ranks_than_gpus_is_refused_before_the_container_starts(tmp_path: Path) -> None:
    # D x T ranks each take a GPU: 4 x 2 do not fit the 4 GPUs of this host.
    with pytest.raises(GpuSelectionError) as caught:
        config_for(tmp_path, "DATA_PARALLELISM=4\nTENSOR_PARALLELISM=2\n", gpus_on_host=4)
    assert str(caught.value).startswith("GPUS: DATA_PARALLELISM x TENSOR_PARALLELISM = 8 ranks")
    # 2 x 2 fit; and with DATA_PARALLELISM unset, tensor-parallel groups share the GPUs.
    fits = config_for(tmp_path, "DATA_PARALLELISM=2\nTENSOR_PARALLELISM=2\n", gpus_on_host=4)
    assert fits.environment["DATA_PARALLELISM"] == "2"
    assert config_for(tmp_path, "TENSOR_PARALLELISM=2\n", gpus_on_host=4
                      ).environment["DATA_PARALLELISM"] == "2"
    # On the CPU several ranks are processes of the CPU: nothing to count them against.
    assert config_for(tmp_path, "DATA_PARALLELISM=2\nGPUS=none\n", gpus_on_host=4
                      ).environment["DATA_PARALLELISM"] == "2"


def test_an_empty_data_parallelism_is_not_set(tmp_path: Path) -> None:
    config = config_for(tmp_path, "DATA_PARALLELISM=\n", gpus_on_host=3)
    assert config.environment["DATA_PARALLELISM"] == "3"


def test_gpus_the_host_lacks_are_one_line_naming_gpus(tmp_path: Path) -> None:
    with pytest.raises(GpuSelectionError) as caught:
        config_for(tmp_path, "GPUS=0,2,5\n", gpus_on_host=2)
    assert str(caught.value) == "GPUS: GPU 2, 5 is not on this host, which has 2 (indices 0..1)"
    # No GPU detected: GPUS=0 is left to the engine, as GPUS=all is.
    assert config_for(tmp_path, "GPUS=0\n", gpus_on_host=0).gpus == GpuPlan(("0",), 1)


def test_the_cli_reports_gpus_the_host_lacks_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "HostGpuProbe", lambda: FakeGpuProbe(1))
    env = tmp_path / "run.env"
    env.write_text(TCP + "GPUS=1\n")
    result = CliRunner().invoke(app, ["--env-file", str(env), "--no-tui", "--client-version", "1"])
    assert result.exit_code == 2
    assert result.output == "run-manager: GPUS: GPU 1 is not on this host, which has 1 (indices 0..0)\n"


# --- against the real Docker engine ----------------------------------------------------

@pytest.fixture
def cuda_alias(docker_client: docker.DockerClient, client_image: str, run_id: str) -> Iterator[str]:
    """A `-cuda` tag of the CPU client image, in a repository of this test's own: the engine
    needs an image to create a container from, and the real CUDA image is never built by
    the tests. Yields the repository."""
    repository = f"psyche-client-{run_id}"
    version = client_image.rpartition(":")[2]
    docker_client.images.get(client_image).tag(repository, f"{version}-cuda")
    yield repository
    docker_client.images.remove(f"{repository}:{version}-cuda", noprune=True)


@pytest.mark.parametrize(("gpus_value", "expected_request"), [
    ("all", {"Driver": "", "Count": -1, "DeviceIDs": [], "Capabilities": [["gpu"]]}),
    ("0,1", {"Driver": "", "Count": 0, "DeviceIDs": ["0", "1"], "Capabilities": [["gpu"]]}),
])
@pytest.mark.usefixtures("no_leftover_containers")
def test_the_engine_creates_the_container_with_its_device_request(
    docker_client: docker.DockerClient, client_image: str, cuda_alias: str, run_id: str,
    tmp_path: Path, gpus_value: str, expected_request: dict[str, object],
) -> None:
    version = client_image.rpartition(":")[2]
    settings = settings_from(tmp_path, f"CLIENT_IMAGE={cuda_alias}\nGPUS={gpus_value}\n")
    settings = settings.model_copy(update={"RUN_ID": run_id})
    config = supervisor_config(settings, RunOptions(), FakeGpuProbe(2))
    supervisor = Supervisor(docker_client, PinnedVersionSource(version), config, print)
    # Created, never started: the engine has no GPU runtime to start it with.
    container = engine.create_container(docker_client, supervisor.container_spec(version))
    try:
        container.reload()
        host_config = container.attrs["HostConfig"]
        [request] = host_config["DeviceRequests"]
        assert {key: request.get(key) for key in expected_request} == expected_request
        assert container.attrs["Config"]["Image"] == f"{cuda_alias}:{version}-cuda"
        assert "DATA_PARALLELISM=2" in container.attrs["Config"]["Env"]
        assert f"CLIENT_VERSION={version}" in container.attrs["Config"]["Env"]
        assert container.status == "created"
    finally:
        engine.remove_container(container)


@pytest.mark.usefixtures("no_leftover_containers")
def test_the_cpu_container_carries_no_device_request(
    docker_client: docker.DockerClient, client_image: str, run_id: str, tmp_path: Path
) -> None:
    version = client_image.rpartition(":")[2]
    settings = settings_from(tmp_path, "GPUS=none\n").model_copy(update={"RUN_ID": run_id})
    config = supervisor_config(settings, RunOptions(), FakeGpuProbe(2))
    supervisor = Supervisor(docker_client, PinnedVersionSource(version), config, print)
    container = engine.create_container(docker_client, supervisor.container_spec(version))
    try:
        container.reload()
        assert not container.attrs["HostConfig"]["DeviceRequests"]
        assert container.attrs["Config"]["Image"] == client_image
    finally:
        engine.remove_container(container)


async def test_the_supervisor_asks_for_the_cuda_image_of_the_version(
    docker_client: docker.DockerClient, tmp_path: Path, run_id: str
) -> None:
    settings = settings_from(tmp_path, "CLIENT_IMAGE=psyche-client-absent\n")
    settings = settings.model_copy(update={"RUN_ID": run_id})
    config = supervisor_config(settings, RunOptions(local=True), FakeGpuProbe(1))
    events: list[SupervisorEvent] = []
    supervisor = Supervisor(docker_client, PinnedVersionSource("9.9.9"), config, events.append)
    result = await supervisor.run()
    # Final, not retried: no image of the run's version here and --local forbids pulling.
    assert events == [result] and result.reason == "no-image"
    assert result.message.startswith("the run wants client version 9.9.9, and its image "
                                     "cannot be had: image psyche-client-absent:9.9.9-cuda is "
                                     "not on this machine")
    assert "scripts/build_client_image.sh --cuda" in result.message
    assert "GPUS=none runs the CPU one" in result.message


@pytest.mark.usefixtures("no_leftover_containers")
def test_starting_a_gpu_container_without_a_gpu_runtime_is_one_clear_line(
    client_image: str, cuda_alias: str, run_id: str, tmp_path: Path
) -> None:
    version = client_image.rpartition(":")[2]
    env = tmp_path / "run.env"
    env.write_text(f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS=127.0.0.1:4000\nGPUS=all\n"
                   f"CLIENT_IMAGE={cuda_alias}\n")
    result = subprocess.run(
        [sys.executable, "-c", "from run_manager.cli import main; main()", "--env-file", str(env),
         "--no-tui", "--local", "--client-version", version],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    assert result.stderr.splitlines() == [
        f"run-manager: GPUs: all (none detected here: the engine decides); "
        f"image {cuda_alias}:<version>-cuda; DATA_PARALLELISM=1",
        f"run-manager: {engine.NVIDIA_TOOLKIT_MESSAGE}",
    ], output
