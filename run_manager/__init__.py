"""The run-manager: supervises the versioned client container and shows the run.

Public surface, loaded on first use: `--help` must not pay for docker-py or
pydantic-settings. Textual is never imported here; the TUI lives in `run_manager.tui`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the real names for type checkers; at run time they load lazily
    from psyche_common.run_view import RunSnapshot
    from run_manager.docker_supervisor import Supervisor, SupervisorConfig
    from run_manager.settings import RunManagerSettings, SettingsError, load_settings
    from run_manager.sources.coordinator import (
        CoordinatorSource,
        CoordinatorUnavailable,
        PinnedVersionSource,
    )
    from run_manager.sources.tcp_coordinator import TcpCoordinatorSource

_EXPORTS = {
    "Supervisor": "run_manager.docker_supervisor",
    "SupervisorConfig": "run_manager.docker_supervisor",
    "RunManagerSettings": "run_manager.settings",
    "SettingsError": "run_manager.settings",
    "load_settings": "run_manager.settings",
    "CoordinatorSource": "run_manager.sources.coordinator",
    "CoordinatorUnavailable": "run_manager.sources.coordinator",
    "PinnedVersionSource": "run_manager.sources.coordinator",
    "RunSnapshot": "psyche_common.run_view",
    "TcpCoordinatorSource": "run_manager.sources.tcp_coordinator",
}
__all__ = [  # the keys of _EXPORTS
    "CoordinatorSource",
    "CoordinatorUnavailable",
    "PinnedVersionSource",
    "RunManagerSettings",
    "RunSnapshot",
    "SettingsError",
    "Supervisor",
    "SupervisorConfig",
    "TcpCoordinatorSource",
    "load_settings",
]


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'run_manager' has no attribute {name!r}")
