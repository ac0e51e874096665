"""What the client runtime needs from a coordinator backend, and what it gets back.

    backend.run(on_state, on_error, stop)   follow the coordinator until `stop` is set:
                                             every new state -> await on_state(ServerState),
                                             every refused message -> on_error(ErrorReply)
    await backend.send(message)              WarmupWitness | WitnessSubmit | HealthCheck |
                                             CheckpointReport | Withdraw; False if it could
                                             not be sent (not connected)

Two implementations: `tcp.TcpBackend` (a `psyche-coordinator` server) and
`solana.SolanaBackend` (the coordinator program's account over JSON-RPC). A refusal that
retrying cannot fix (wrong run, bad signature, no authorization) is `BackendRejected`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from coordinator import CoordinatorState
from coordinator_tcp.protocol import ErrorReply


class BackendRejected(RuntimeError):
    """The coordinator refused this client for a reason retrying will not change."""


@dataclass(frozen=True)
class ServerState:
    state: CoordinatorState
    p2p_addresses: dict[str, str]
    server_time: int


StateCallback = Callable[[ServerState], Awaitable[None]]
ErrorCallback = Callable[[ErrorReply], None]


class CoordinatorBackend(Protocol):
    async def run(self, on_state: StateCallback, on_error: ErrorCallback,
                  stop: asyncio.Event) -> None: ...

    async def send(self, message: BaseModel) -> bool: ...
