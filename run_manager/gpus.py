"""The client container's GPUs: what GPUS= asks for, what the host has, what Docker gets.

GPUS (env file):
  auto (default)  every NVIDIA GPU of the host when it has any (HostGpuProbe), else the CPU
  all             every GPU, even when none is detected here (the engine then decides)
  none            the CPU, whatever the host has
  0,1,...         these GPUs, by nvidia-smi's index
With GPUs the run-manager runs the CUDA variant of the client image (`REPO:VERSION-cuda`,
built by `scripts/build_client_image.sh --cuda`), asks the engine for them with a device
request (what `docker run --gpus` sends: the NVIDIA Container Toolkit serves it), and,
when the env file does not set DATA_PARALLELISM, sets it to the number of GPUs the
container sees (divided by TENSOR_PARALLELISM).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

CUDA_TAG_SUFFIX = "-cuda"
"""The CUDA image of client version V is REPO:V-cuda (the CPU one, REPO:V)."""

_INDEX = re.compile(r"\d{1,4}")
# `nvidia-smi -L`: one line per GPU, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)"; MIG
# devices are indented "  MIG 1g.10gb Device 0: ..." lines under their GPU.
_NVIDIA_SMI_GPU_LINE = re.compile(r"GPU \d+: ")


class GpuSelectionError(ValueError):
    """GPUS names GPUs this host does not have; the message starts with "GPUS: "."""


@dataclass(frozen=True)
class GpuSetting:
    """GPUS, parsed."""

    mode: Literal["auto", "all", "none", "ids"]
    device_ids: tuple[str, ...] = ()


_WORDS = {"auto": GpuSetting("auto"), "all": GpuSetting("all"), "none": GpuSetting("none")}


def parse_gpus(text: str) -> GpuSetting:
    """`auto`, `all`, `none` or a comma-separated list of GPU indices; ValueError otherwise."""
    value = text.strip().lower()
    if value in _WORDS:
        return _WORDS[value]
    items = [item.strip() for item in value.split(",")]
    if not all(_INDEX.fullmatch(item) for item in items):
        raise ValueError(f"must be auto, all, none or GPU indices such as 0,1 (got {text!r})")
    ids = tuple(str(int(item)) for item in items)
    repeated = sorted({i for i in ids if ids.count(i) > 1}, key=int)
    if repeated:
        raise ValueError(f"GPU {', '.join(repeated)} listed more than once (got {text!r})")
    return GpuSetting("ids", ids)


class GpuProbe(Protocol):
    """How many NVIDIA GPUs the host has (0: none, or no driver)."""

    def gpu_count(self) -> int: ...


class HostGpuProbe:
    """The host's NVIDIA GPUs: the driver's /proc/driver/nvidia/gpus (one directory per
    GPU), else the `GPU n:` lines of `nvidia-smi -L`; 0 without a driver."""

    def __init__(self, proc_dir: Path = Path("/proc/driver/nvidia/gpus"),
                 nvidia_smi: str = "nvidia-smi", timeout_s: float = 10.0) -> None:
        self.proc_dir = proc_dir
        self.nvidia_smi = nvidia_smi
        self.timeout_s = timeout_s

    def gpu_count(self) -> int:
        try:
            return sum(1 for entry in self.proc_dir.iterdir() if entry.is_dir())
        except OSError:
            pass  # no NVIDIA kernel driver loaded here, or /proc is not Linux's: ask nvidia-smi
        executable = shutil.which(self.nvidia_smi)
        if executable is None:
            return 0
        try:
            result = subprocess.run([executable, "-L"], capture_output=True, text=True,
                                    timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return 0
        return count_nvidia_smi_gpus(result.stdout) if result.returncode == 0 else 0


def count_nvidia_smi_gpus(listing: str) -> int:
    """The GPUs in `nvidia-smi -L` output (MIG device lines are not GPUs of their own)."""
    return sum(1 for line in listing.splitlines() if _NVIDIA_SMI_GPU_LINE.match(line))


@dataclass(frozen=True)
class GpuPlan:
    """The GPUs one client container gets."""

    device_ids: tuple[str, ...] | None
    """None: every GPU of the host (Docker's count=-1); else these indices."""
    visible: int
    """GPUs the container sees: 0 when GPUS=all and none was detected here."""


def plan_gpus(setting: GpuSetting, probe: GpuProbe) -> GpuPlan | None:
    """The container's GPUs, None for the CPU. Raises GpuSelectionError when GPUS names an
    index the host does not have (checked only when GPUs were detected: GPUS=0 on a host
    where none is detected is left to the engine, as GPUS=all is)."""
    if setting.mode == "none":
        return None
    count = probe.gpu_count()
    if setting.mode == "auto":
        return GpuPlan(None, count) if count > 0 else None
    if setting.mode == "all":
        return GpuPlan(None, count)
    missing = [i for i in setting.device_ids if count > 0 and int(i) >= count]
    if missing:
        raise GpuSelectionError(
            f"GPUS: GPU {', '.join(missing)} is not on this host, which has {count} "
            f"(indices 0..{count - 1})"
        )
    return GpuPlan(setting.device_ids, len(setting.device_ids))


def image_tag(version: str, gpus: GpuPlan | None) -> str:
    """The client image tag for a client version: VERSION, or VERSION-cuda with GPUs."""
    return f"{version}{CUDA_TAG_SUFFIX}" if gpus is not None else version


def default_data_parallelism(gpus: GpuPlan | None, tensor_parallelism: int = 1) -> int:
    """DATA_PARALLELISM when the env file leaves it out: one rank per visible GPU (a
    tensor-parallel group of TENSOR_PARALLELISM GPUs counts once); 1 on the CPU."""
    if gpus is None or gpus.visible <= 0:
        return 1
    return max(1, gpus.visible // max(1, tensor_parallelism))


def describe_gpus(gpus: GpuPlan, repository: str, environment: dict[str, str]) -> str:
    """One line for the operator: which GPUs, which image, how many data-parallel ranks."""
    if gpus.device_ids is not None:
        which = f"GPU {','.join(gpus.device_ids)}"
    elif gpus.visible > 0:
        which = f"all {gpus.visible} of this host"
    else:
        which = "all (none detected here: the engine decides)"
    return (f"GPUs: {which}; image {repository}:<version>{CUDA_TAG_SUFFIX}; "
            f"DATA_PARALLELISM={environment.get('DATA_PARALLELISM', '1')}")
