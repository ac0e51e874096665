"""A connection that speaks the coordinator protocol, for the client runtime, the
run-manager's observer, the testnet's watcher and benches.

    connection, welcome = await ProtocolConnection.connect(host, port, identity, run_id,
                                                           p2p_address="", observe=True)
    message = await connection.receive()       # StateUpdate | Heartbeat | ErrorReply
    await connection.send(WitnessSubmit(...)); await connection.close()

It is the shared `psyche_common.tcp.Connection` with the coordinator's server messages
as its default decoder; `JoinRefused` is raised when the server refuses the join.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from coordinator_tcp.protocol import Welcome, decode_server_message
from psyche_common.identity import Identity
from psyche_common.tcp.connection import Connection, JoinRefused


class ProtocolConnection(Connection):
    @classmethod
    async def connect(  # the decoder becomes optional
        cls,
        host: str,
        port: int,
        identity: Identity,
        run_id: str,
        p2p_address: str = "",
        *,
        decode: Callable[[bytes], Any] = decode_server_message,
        observe: bool = False,
        client_version: str = "",
        timeout_s: float = 10.0,
        expect_welcome: type[BaseModel] = Welcome,
        local_addr: tuple[str, int] | None = None,
    ) -> tuple[Connection, Any]:
        return await super().connect(
            host, port, identity, run_id, p2p_address, decode=decode, observe=observe,
            client_version=client_version, timeout_s=timeout_s, expect_welcome=expect_welcome,
            local_addr=local_addr)


__all__ = ["JoinRefused", "ProtocolConnection"]
