"""Where the run-manager learns what the run wants: the coordinator source.

A source answers two questions: which client version the run requires (the
supervisor starts that image) and what the run looks like now (the TUI's run and
witness panels). Backends plug in here: a pinned version, the TCP coordinator
(`tcp_coordinator.TcpCoordinatorSource`) and the Solana coordinator account later,
each a class with these methods.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

RunPhase = Literal[
    "Uninitialized",
    "WaitingForMembers",
    "Warmup",
    "RoundTrain",
    "RoundWitness",
    "Cooldown",
    "Finished",
    "Paused",
]
ClientHealth = Literal["Healthy", "Dropped", "Withdrawn", "Ejected"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunClient(_Frozen):
    """One client of the current epoch, as the coordinator lists it."""

    id: str
    """The client's public key (base58 on Solana, hex on TCP runs)."""
    state: ClientHealth = "Healthy"
    points: int | None = None
    """Reward points earned so far, where the backend keeps them."""


class WitnessProgress(_Frozen):
    """This round's elected witnesses and how far the round is from quorum."""

    elected: list[str] = Field(default_factory=list)
    """Client ids elected as witnesses of this round."""
    received: list[str] = Field(default_factory=list)
    """Elected witnesses whose witness message the coordinator has."""
    quorum: int = Field(default=0, ge=0)
    """Witness messages needed: {1->1, 2->2, 3->2, n>=4 -> floor(2n/3)}."""

    @property
    def fraction(self) -> float:
        return 0.0 if self.quorum == 0 else min(1.0, len(self.received) / self.quorum)


class RunSnapshot(_Frozen):
    """What the run looks like at one instant."""

    run_id: str
    phase: RunPhase
    phase_elapsed_s: float = Field(default=0.0, ge=0)
    """Seconds since the coordinator entered `phase`."""
    phase_timeout_s: float | None = None
    """Seconds the phase lasts at most (None: no time limit, e.g. WaitingForMembers)."""
    epoch: int = Field(default=0, ge=0)
    step: int = Field(default=0, ge=0)
    clients: list[RunClient] = Field(default_factory=list)
    witnesses: WitnessProgress = Field(default_factory=WitnessProgress)
    client_version: str = ""


class CoordinatorUnavailable(Exception):
    """The source cannot tell what the run wants; the message names the coordinator."""


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


def _checked_version(version: str) -> str:
    # A Docker tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}.
    import re

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", version):
        raise ValueError(
            f"client version {version!r} is not a valid image tag "
            "(letters, digits, '_', '.', '-'; at most 128; not starting with '.' or '-')"
        )
    return version
