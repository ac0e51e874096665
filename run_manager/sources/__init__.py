"""Where the run-manager's data comes from: the run's coordinator and the client's metrics."""

from typing import TYPE_CHECKING

from run_manager.sources.coordinator import (
    CoordinatorSource,
    CoordinatorUnavailable,
    PinnedVersionSource,
    RunClient,
    RunPhase,
    RunSnapshot,
    WitnessProgress,
)
from run_manager.sources.metrics import ClientMetrics, ConnectedPeer

if TYPE_CHECKING:  # the real names for type checkers; at run time they load lazily
    from run_manager.sources.http_metrics import HttpClientMetricsSource, MetricsUnavailable
    from run_manager.sources.tcp_coordinator import TcpCoordinatorSource

# The client imports `run_manager.sources.metrics`, which runs this file: the HTTP
# source (httpx) and the TCP source (the coordinator packages) load only when asked for.
_LAZY = {
    "HttpClientMetricsSource": "http_metrics",
    "MetricsUnavailable": "http_metrics",
    "TcpCoordinatorSource": "tcp_coordinator",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f"run_manager.sources.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(name)


__all__ = [
    "ClientMetrics",
    "ConnectedPeer",
    "CoordinatorSource",
    "CoordinatorUnavailable",
    "HttpClientMetricsSource",
    "MetricsUnavailable",
    "PinnedVersionSource",
    "RunClient",
    "RunPhase",
    "RunSnapshot",
    "TcpCoordinatorSource",
    "WitnessProgress",
]
