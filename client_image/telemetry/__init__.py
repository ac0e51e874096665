"""OpenTelemetry for every program: metrics, traces and logs, Prometheus and OTLP/HTTP.

Public surface:
    TelemetryOptions, telemetry_options   export options and the Typer helper adding them
    Telemetry, ServiceIdentity            providers, exporters and the instruments
    ClientTelemetry, traced_phase         the client's metrics and per-phase spans
    CoordinatorTelemetry                  the TCP coordinator's metrics
    RunManagerTelemetry                   the run-manager's container metrics
    names                                 the registry of every exported metric

Loaded lazily: a CLI that only declares the options (`--help`) does not import the
OpenTelemetry SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_WHERE = {
    "ClientTelemetry": "client_metrics", "traced_phase": "client_metrics",
    "CoordinatorTelemetry": "coordinator_metrics", "ServiceIdentity": "core",
    "Telemetry": "core", "TelemetryOptions": "options", "telemetry_options": "options",
    "RunManagerTelemetry": "run_manager_metrics", "names": "names",
}

if TYPE_CHECKING:
    from client_image.telemetry import names
    from client_image.telemetry.client_metrics import ClientTelemetry, traced_phase
    from client_image.telemetry.coordinator_metrics import CoordinatorTelemetry
    from client_image.telemetry.core import ServiceIdentity, Telemetry
    from client_image.telemetry.options import TelemetryOptions, telemetry_options
    from client_image.telemetry.run_manager_metrics import RunManagerTelemetry


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(f"{__name__}.{module}")
    return loaded if name == "names" else getattr(loaded, name)


__all__ = [
    "ClientTelemetry", "CoordinatorTelemetry", "RunManagerTelemetry", "ServiceIdentity",
    "Telemetry", "TelemetryOptions", "names", "telemetry_options", "traced_phase",
]
