"""Where the run-manager learns what the run wants: the coordinator source.

A source answers two questions: which client version the run requires (the
supervisor starts that image) and what the run looks like now (the TUI's run and
witness panels). Three sources, each a class with these methods: a pinned version
(`PinnedVersionSource`), the TCP coordinator (`tcp_coordinator.TcpCoordinatorSource`)
and the Solana coordinator account (`solana_coordinator.SolanaCoordinatorSource`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from psyche_common.run_view import RunSnapshot


class CoordinatorUnavailable(Exception):
    """The source cannot tell what the run wants; the message names the coordinator."""


@dataclass(frozen=True)
class Heard:
    """When the coordinator was last heard from (any message: a state, a heartbeat), so
    that a coordinator that died or hangs shows as silent instead of as its last state."""

    at_monotonic: float
    """time.monotonic() of the last message."""
    connected: bool
    """Whether the connection it came on is still open."""
    problem: str = ""
    """Why the connection was lost, when it was."""


@runtime_checkable
class CoordinatorSource(Protocol):
    """The run's coordinator, as the run-manager sees it."""

    async def client_version(self) -> str:
        """Returns the client version the run requires now (the image tag to run).

        Raises CoordinatorUnavailable when the coordinator cannot be asked.
        """
        ...

    async def snapshot(self) -> RunSnapshot | None:
        """Returns the run's current state, or None where the source cannot see it."""
        ...

    async def close(self) -> None:
        """Releases connections; the source is not used afterwards."""
        ...

    def heard(self) -> Heard | None:
        """When the coordinator last spoke; None where the source has no such signal (a
        pinned version; a run on Solana, whose stalls show as a phase past its limit)."""
        ...


class PinnedVersionSource:
    """A run whose client version the operator states (`--client-version`).

    It sees no run state: the run and witness panels stay empty. The version can be
    changed while the run-manager runs (`pin`), and the supervisor picks it up at
    the next restart, as it would a coordinator's new version.
    """

    def __init__(self, version: str) -> None:
        self._version = _checked_version(version)

    def pin(self, version: str) -> None:
        self._version = _checked_version(version)

    async def client_version(self) -> str:
        return self._version

    async def snapshot(self) -> RunSnapshot | None:
        return None

    async def close(self) -> None:
        return None

    def heard(self) -> Heard | None:
        return None


def _checked_version(version: str) -> str:
    # A Docker tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}.
    import re

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", version):
        raise ValueError(
            f"client version {version!r} is not a valid image tag "
            "(letters, digits, '_', '.', '-'; at most 128; not starting with '.' or '-')"
        )
    return version
