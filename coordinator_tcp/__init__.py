"""The TCP backend of the coordinator: wire protocol, server, persistence, data server, TUI.

Public surface (import from the submodules; they are loaded lazily from here too):

    protocol        PROTOCOL_VERSION, Challenge, Join(observe=...), Welcome, StateUpdate,
                    Heartbeat, ErrorReply, WarmupWitness, WitnessSubmit, HealthCheck,
                    CheckpointReport, Withdraw, WitnessModel, Notice, ResyncAddresses, encode,
                    decode_client_message, decode_server_message, join_signing_bytes,
                    ProtocolError, VersionMismatch
                    (the handshake messages and the framing are psyche_common.tcp's)
    addresses       AddressBook (the server's p2p address map: pruned, numbered changes),
                    AddressMirror (a receiver's copy; says when to ask for the whole map)
    client          ProtocolConnection.connect(host, port, identity, run_id, p2p_address,
                    observe=False) -> (connection, welcome); JoinRefused
    server          CoordinatorServer(coordinator, ServerOptions, p2p_addresses=, clock=,
                    seed_source=, resumed=, checkpoint_history=); await start()/stop();
                    publish(); pending;
                    the run's rules: pending_clients, needed_addresses,
                    apply_client_event, waiting_notices
    server_options  ServerOptions (what the server is told), ServerStats (what it counts)
    checkpoint_history  CheckpointHistory (is a reported commit on main?), HubHistory,
                    ReportChecks (the server's checks in flight)
    connections     Connections (listening, handshake, reading), Peer (a joined connection)
    broadcaster     StateBroadcaster (one broadcast's messages), fan_out
    persistence     StateStore(dir).save(encoded, addresses) / .load()
    data_protocol   DataWelcome, DataRequest, DataResponse, DataRejected
    data_server     DataServer(DataServerConfig, run_id, members, DataServerOptions)
    runner          RunOptions, load_run, run_coordinator   (`psyche-coordinator run`)
    summary         summarize(state, now, connected) -> StateSummary   (TUIs)
    tui             CoordinatorApp(server, data_server)      (only with --tui true)
    telemetry       CoordinatorTelemetry (the server's OpenTelemetry adapter)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real names for type checkers; at run time they load lazily
    from coordinator_tcp.client import ProtocolConnection
    from coordinator_tcp.data_server import DataServer, DataServerOptions
    from coordinator_tcp.persistence import StateStore
    from coordinator_tcp.runner import RunOptions, run_coordinator
    from coordinator_tcp.server import CoordinatorServer
    from coordinator_tcp.server_options import ServerOptions

_LAZY = {
    "CoordinatorServer": "coordinator_tcp.server",
    "ServerOptions": "coordinator_tcp.server_options",
    "DataServer": "coordinator_tcp.data_server",
    "DataServerOptions": "coordinator_tcp.data_server",
    "ProtocolConnection": "coordinator_tcp.client",
    "StateStore": "coordinator_tcp.persistence",
    "RunOptions": "coordinator_tcp.runner",
    "run_coordinator": "coordinator_tcp.runner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = [  # the keys of _LAZY
    "CoordinatorServer",
    "DataServer",
    "DataServerOptions",
    "ProtocolConnection",
    "RunOptions",
    "ServerOptions",
    "StateStore",
    "run_coordinator",
]
