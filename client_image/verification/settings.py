"""Replay settings on this machine: what a trainer declares (`capture`), whether a follower
can replay in a declared set (`cannot_reproduce`) and replaying in it (`active`).
The settings and their wire bytes are formats/replay_settings.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from client_image.formats.replay_settings import MAX_VERSION_CHARS, ReplaySettings

KERNELS = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
           "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
CUDA_ONLY_KERNELS = ("efficient", "cudnn")


def onednn_on() -> bool:
    return bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)


def hardware(device: str | torch.device) -> str:
    """What picks the kernels' code paths here (formats/replay_settings.py `hardware`)."""
    place = torch.device(device)
    if place.type == "cuda":
        return torch.cuda.get_device_name(place)[:64]
    bf16 = (torch.backends.mkldnn.is_available()
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))
    return f"{torch.backends.cpu.get_cpu_capability()}{' onednn-bf16' if bf16 else ''}"


def capture(compute: str, micro_batch: int, device: str | torch.device,
            attention: str = "auto", threads: int | None = None,
            onednn: bool | None = None) -> ReplaySettings:
    """The settings a trainer of this process trains in: `attention` is the SDPA kernel it
    pins ("auto": none, torch chooses), threads and oneDNN as they are now unless given."""
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"replay settings: device {kind!r} is neither cpu nor cuda")
    return ReplaySettings(
        compute=compute, device=kind, attention=attention,
        onednn=onednn_on() if onednn is None else onednn, micro_batch=micro_batch,
        threads=(torch.get_num_threads() if threads is None else threads) if kind == "cpu" else 0,
        torch_version=torch.__version__, hardware=hardware(device))


def split_over_ranks(settings: ReplaySettings, dp: int, tp: int) -> ReplaySettings:
    """`settings` of a trainer whose model is split over dp x tp ranks: its hardware names
    the split, which changes the reduction order as another kernel would. No follower
    replays a split model yet, so `cannot_reproduce` says so and the loose limits judge it
    (counted as loose judgements), but the result is declared, not refused as undeclared."""
    suffix = f" split dp{dp} tp{tp}"
    return dataclasses.replace(
        settings, hardware=settings.hardware[:MAX_VERSION_CHARS - len(suffix)] + suffix)


def cannot_reproduce(declared: ReplaySettings, device: str | torch.device) -> str | None:
    """Why a follower on `device` cannot replay in `declared`; None when it can."""
    kind = torch.device(device).type
    if declared.device != kind:
        return f"declared device {declared.device}, this follower's is {kind}"
    if declared.torch_version != torch.__version__:
        return f"declared torch {declared.torch_version}, this follower has {torch.__version__}"
    if declared.hardware != hardware(device):
        return f"declared hardware {declared.hardware}, this follower's is {hardware(device)}"
    if kind == "cpu" and declared.attention in CUDA_ONLY_KERNELS:
        return f"attention kernel {declared.attention} is CUDA-only"
    if declared.onednn and not torch.backends.mkldnn.is_available():
        return "declared oneDNN, this torch build has none"
    if kind == "cpu" and declared.threads < 1:
        return "declared 0 threads on a CPU"
    return None


@contextlib.contextmanager
def active(settings: ReplaySettings) -> Iterator[None]:
    """Compute in `settings`' threads, attention kernel and oneDNN switch, and put them
    back after (micro-batch and dtype are the shadow trainer's own: its constructor's)."""
    threads = torch.get_num_threads()
    onednn = torch.backends.mkldnn.enabled
    kernel = (sdpa_kernel([KERNELS[settings.attention]]) if settings.attention != "auto"
              else contextlib.nullcontext())
    try:
        if settings.device == "cpu":
            torch.set_num_threads(settings.threads)
        # Set directly: mkldnn.flags() also sets its TF32 switch, which warns on CPU builds.
        torch.backends.mkldnn.enabled = settings.onednn  # type: ignore[assignment]  # torch types it as a flag object
        with kernel:
            yield
    finally:
        torch.set_num_threads(threads)
        torch.backends.mkldnn.enabled = onednn  # type: ignore[assignment]  # torch types it as a flag object
