"""Where the run-manager's data comes from: the run's coordinator and the client's metrics."""

from run_manager.sources.coordinator import (
    CoordinatorSource,
    PinnedVersionSource,
    RunClient,
    RunPhase,
    RunSnapshot,
    WitnessProgress,
)
from run_manager.sources.metrics import ClientMetrics, ConnectedPeer

# The client imports `run_manager.sources.metrics`, which runs this file: the HTTP
# source (httpx) is loaded only when asked for.
_LAZY = {"HttpClientMetricsSource", "MetricsUnavailable"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from run_manager.sources import http_metrics

        return getattr(http_metrics, name)
    raise AttributeError(name)


__all__ = [
    "ClientMetrics",
    "ConnectedPeer",
    "CoordinatorSource",
    "HttpClientMetricsSource",
    "MetricsUnavailable",
    "PinnedVersionSource",
    "RunClient",
    "RunPhase",
    "RunSnapshot",
    "WitnessProgress",
]
