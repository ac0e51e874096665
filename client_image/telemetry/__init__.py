"""The client's telemetry adapter: its metrics, its events and per-phase spans (psyche_common.telemetry
holds the providers and exporters).

    ClientTelemetry

Loaded lazily: importing the runtime does not import the OpenTelemetry SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from client_image.telemetry.client import ClientTelemetry

_NAMES = {"ClientTelemetry"}


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.client"), name)


__all__ = ["ClientTelemetry"]
