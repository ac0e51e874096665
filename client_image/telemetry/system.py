"""The machine as the client's telemetry sees it: this process's CPU and memory, the CUDA
GPUs, and the download bandwidth, sampled at most every `SAMPLE_INTERVAL_S` (Psyche's 5 s).

    SystemSampler(read_download_bytes, interval_s=5.0).latest() -> SystemSample
    SystemSample(cpu_percent, rss_bytes, bytes_per_second, gpus: tuple[GpuReading, ...])
    download_rate(earlier, later) -> bytes/s between two (time, bytes) readings
    nvml_gpus() -> NvmlGpus | None   (None without CUDA or NVML: no GPU series at all)

Sampling happens on collection (an export or a scrape reads `latest()`), not on a thread
of its own: a reading older than the interval is replaced, so the values change every
5 s while anyone collects, and nothing runs when nobody does. CPU percent is psutil's
(100 = one core busy over the window since the previous sample).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

SAMPLE_INTERVAL_S = 5.0


@dataclass(frozen=True)
class GpuReading:
    index: int  # NVML's device index
    usage_percent: float
    memory_bytes: int  # in use on the device, by every process
    temperature_c: float


@dataclass(frozen=True)
class SystemSample:
    at: float  # monotonic seconds
    cpu_percent: float
    rss_bytes: int
    bytes_per_second: float | None  # None until two readings span a window
    gpus: tuple[GpuReading, ...] = ()


def download_rate(earlier: tuple[float, int] | None, later: tuple[float, int]) -> float | None:
    """Bytes per second between two (monotonic time, total bytes) readings."""
    if earlier is None or later[0] <= earlier[0]:
        return None
    return max(0, later[1] - earlier[1]) / (later[0] - earlier[0])


class NvmlGpus:
    """The NVIDIA GPUs through NVML (nvidia-ml-py); built only by `nvml_gpus()`."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i)
                         for i in range(nvml.nvmlDeviceGetCount())]

    def read(self) -> tuple[GpuReading, ...]:
        nvml = self._nvml
        readings = []
        for index, handle in enumerate(self._handles):
            try:
                readings.append(GpuReading(
                    index=index,
                    usage_percent=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).used),
                    temperature_c=float(nvml.nvmlDeviceGetTemperature(
                        handle, nvml.NVML_TEMPERATURE_GPU))))
            except nvml.NVMLError:  # a device that stopped answering: leave it out
                continue
        return tuple(readings)


def nvml_gpus() -> NvmlGpus | None:
    """The GPUs where CUDA is available and NVML answers; None otherwise (a CPU machine
    exports no GPU series rather than made-up ones)."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        return NvmlGpus(pynvml)
    except Exception:  # no driver library, or NVML refuses: no GPU metrics
        return None


class SystemSampler:
    def __init__(self, read_download_bytes: Callable[[], int], *,
                 interval_s: float = SAMPLE_INTERVAL_S, gpus: NvmlGpus | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.read_download_bytes = read_download_bytes
        self.interval_s = interval_s
        self.gpus = gpus
        self._clock = clock
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only starts psutil's window
        self._lock = threading.Lock()  # the exporter and a scrape may collect at once
        self._downloads: tuple[float, int] | None = (clock(), read_download_bytes())
        self._sample: SystemSample | None = None

    def latest(self) -> SystemSample:
        with self._lock:
            now = self._clock()
            if self._sample is None or now - self._sample.at >= self.interval_s:
                self._sample = self._take(now)
            return self._sample

    def _take(self, now: float) -> SystemSample:
        downloads = (now, self.read_download_bytes())
        rate = download_rate(self._downloads, downloads)
        self._downloads = downloads
        return SystemSample(
            at=now, cpu_percent=self._process.cpu_percent(None),
            rss_bytes=self._process.memory_info().rss, bytes_per_second=rate,
            gpus=self.gpus.read() if self.gpus is not None else ())
