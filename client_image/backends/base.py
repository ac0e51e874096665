"""What the client runtime needs from a coordinator backend, and what it gets back.

    backend.run(on_state, on_error, stop)   follow the coordinator until `stop` is set:
                                             every new state -> await on_state(ServerState),
                                             every refused message -> on_error(Refusal)
    await backend.send_witness(RoundWitness)             the typed port: each takes a
    await backend.send_warmup_witness(WarmupWitness)     domain message of
    await backend.send_health_check(HealthCheck)         `coordinator.messages` and says
    await backend.report_checkpoint(CheckpointReport)    whether it was sent (False: not
    await backend.report_verification(VerificationReport) connected, or refused)
    await backend.withdraw()                             (now, only when connected)

Two implementations, each encoding its own wire: `tcp.TcpBackend` (a `psyche-coordinator`
server: the TCP protocol's messages) and `solana.SolanaBackend` (the coordinator
program's account over JSON-RPC: one instruction per message). As Psyche's `Backend`
trait (`shared/watcher/src/traits.rs`), the runtime never sees either wire. A refusal
that retrying cannot fix (wrong run, bad signature, no authorization) is `BackendRejected`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from coordinator import CoordinatorState
from coordinator.messages import (
    CheckpointReport,
    HealthCheck,
    Refusal,
    RoundWitness,
    WarmupWitness,
)
from coordinator.state import VerificationReport


class BackendRejected(RuntimeError):
    """The coordinator refused this client for a reason retrying will not change."""


@dataclass(frozen=True)
class ServerState:
    state: CoordinatorState
    p2p_addresses: dict[str, str]
    server_time: int


StateCallback = Callable[[ServerState], Awaitable[None]]
ErrorCallback = Callable[[Refusal], None]


class CoordinatorPort(Protocol):
    """What the client says to the coordinator (the round runner's side of a backend)."""

    async def send_witness(self, witness: RoundWitness) -> bool: ...

    async def send_warmup_witness(self, witness: WarmupWitness) -> bool: ...

    async def send_health_check(self, check: HealthCheck) -> bool: ...

    async def report_checkpoint(self, report: CheckpointReport) -> bool: ...

    async def report_verification(self, report: VerificationReport) -> bool: ...

    async def withdraw(self) -> bool:
        """Tell the coordinator this client leaves, only if connected now (an unreachable
        coordinator is not waited for); False if not sent or the backend has no such
        message."""
        ...


class CoordinatorBackend(CoordinatorPort, Protocol):
    async def run(self, on_state: StateCallback, on_error: ErrorCallback,
                  stop: asyncio.Event) -> None: ...
