"""Where the run-manager's data comes from: the run's coordinator and the client's metrics."""

from typing import TYPE_CHECKING

from psyche_common.run_view import RunClient, RunPhase, RunSnapshot, WitnessProgress
from run_manager.sources.coordinator import (
    CoordinatorSource,
    CoordinatorUnavailable,
    Heard,
    PinnedVersionSource,
)

if TYPE_CHECKING:  # the real names for type checkers; at run time they load lazily
    from run_manager.sources.solana_coordinator import SolanaCoordinatorSource
    from run_manager.sources.tcp_coordinator import TcpCoordinatorSource

# The TCP source (the coordinator packages) and the Solana source (solders, the account
# decoders) load only when asked for.
_LAZY = {
    "SolanaCoordinatorSource": "solana_coordinator",
    "TcpCoordinatorSource": "tcp_coordinator",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f"run_manager.sources.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(name)


__all__ = [
    "CoordinatorSource",
    "CoordinatorUnavailable",
    "Heard",
    "PinnedVersionSource",
    "RunClient",
    "RunPhase",
    "RunSnapshot",
    "SolanaCoordinatorSource",
    "TcpCoordinatorSource",
    "WitnessProgress",
]
