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
from typing import Any, ClassVar

from coordinator_tcp.protocol import decode_server_message
from psyche_common.tcp.connection import Connection, JoinRefused


class ProtocolConnection(Connection):
    default_decode: ClassVar[Callable[[bytes], Any] | None] = staticmethod(decode_server_message)


__all__ = ["JoinRefused", "ProtocolConnection"]
