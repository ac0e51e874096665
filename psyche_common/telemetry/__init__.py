"""OpenTelemetry for every program: metrics, traces and logs, Prometheus and OTLP/HTTP.

Public surface:
    TelemetryOptions, telemetry_options   export options and the Typer helper adding them
    Telemetry, ServiceIdentity            providers, exporters and the instruments
    names                                 the registry of every exported metric

Each program's adapter lives beside it: `client_image.telemetry` (ClientTelemetry),
`coordinator_tcp.telemetry` (CoordinatorTelemetry), `run_manager.telemetry`
(RunManagerTelemetry).

Loaded lazily: a CLI that only declares the options (`--help`) does not import the
OpenTelemetry SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_WHERE = {
    "ServiceIdentity": "core", "Telemetry": "core", "TelemetryOptions": "options",
    "telemetry_options": "options", "names": "names",
}

if TYPE_CHECKING:
    from psyche_common.telemetry import names
    from psyche_common.telemetry.core import ServiceIdentity, Telemetry
    from psyche_common.telemetry.options import TelemetryOptions, telemetry_options


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(f"{__name__}.{module}")
    return loaded if name == "names" else getattr(loaded, name)


__all__ = ["ServiceIdentity", "Telemetry", "TelemetryOptions", "names", "telemetry_options"]
