"""Honest joins get in while idle connections fill the server's handshake pool (issue 32).

2,000 idle connections from 200 loopback addresses (10 each; half send half a frame
header, half nothing), held from a process of their own (tests/idle_connections.py),
each opened again 1 s after the server closes it, against a coordinator server in
this process whose handshake pool is 1024 (the fixed global limit they used to fill, so
that every honest join got `Busy`); both processes raise their descriptor limit to the
hard one.
Honest clients, each from an address of its own, then join one after another: every one
gets in within 5 s while the pool stays full, because the pool makes room for each
newcomer by shedding the oldest connection of the busiest address, or one past its
deadline (docs/tcp-admission.md).
bench/join_under_load.py does the same with 10,000 from 1,000 addresses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from idle_connections import IdleConnections, idle_addresses
from tcp_helpers import RUN_ID, Clock, identity, make_state_file, next_state, server_options

from coordinator import Coordinator
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.server import CoordinatorServer
from psyche_common.tcp.admission import raise_fd_limit

IDLE_ADDRESSES = 200
PER_ADDRESS = 10
POOL = 1024
HONEST_JOINS = 20
JOIN_LIMIT_S = 5.0
REOPEN_AFTER_S = 1.0
JOIN_EVERY_S = 0.35  # 20 joins over ~7 s: more than two handshake deadlines (3 s)


async def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


async def test_honest_joins_get_in_while_2000_idle_connections_fill_the_handshake_pool() -> None:
    needed = IDLE_ADDRESSES * PER_ADDRESS + 512  # the server's ends, and the test's own
    if (limit := raise_fd_limit()) < needed:
        pytest.skip(f"this test holds {needed} descriptors; the hard limit (ulimit -Hn) "
                    f"is {limit}")
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file()),
                               server_options(max_handshakes=POOL, handshake_timeout_s=3.0),
                               clock=Clock())  # the clock stands still: the run waits
    await server.start()
    idle = IdleConnections(server.port, idle_addresses(IDLE_ADDRESSES), PER_ADDRESS,
                           reopen_after_s=REOPEN_AFTER_S)
    honest: list[ProtocolConnection] = []
    try:
        idle.start()
        await idle.wait_opened(60)
        gate = server.connections
        # Every idle connection is accepted; those beyond the pool are shed (and reopen).
        await wait_until(lambda: server.stats.handshakes_shed
                         >= IDLE_ADDRESSES * PER_ADDRESS - POOL, 30, "the excess is shed")
        accepted_before = server.stats.connections_accepted
        join_seconds: list[float] = []
        pool_seen: list[int] = []
        for i in range(HONEST_JOINS):
            pool_seen.append(gate.handshakes_in_flight)
            began = time.monotonic()
            connection, _welcome = await ProtocolConnection.connect(
                "127.0.0.1", server.port, identity(100 + i), RUN_ID, f"honest-{i}",
                local_addr=(f"127.9.0.{1 + i}", 0), timeout_s=JOIN_LIMIT_S)
            join_seconds.append(time.monotonic() - began)
            honest.append(connection)
            await next_state(connection)  # served as a client, not just welcomed
            await asyncio.sleep(JOIN_EVERY_S)
        pending = {client.key for client in server.pending}
        assert all(identity(100 + i).public_key in pending for i in range(HONEST_JOINS))
        assert max(join_seconds) < JOIN_LIMIT_S, join_seconds
        # The load held throughout: the pool full at every join (a busy pool keeps the idle
        # connections past their deadline until a newcomer needs the room), and the idle
        # connections kept coming: those shed came back and shed others, a pool's worth
        # at least over the joins.
        assert min(pool_seen) >= POOL - 16, pool_seen
        assert server.stats.connections_accepted - accepted_before >= POOL
        assert idle.closed_by_server >= 2 * POOL
        assert server.stats.protocol_errors == 0 and len(server.peers) == HONEST_JOINS
    finally:
        for connection in honest:
            await connection.close()
        idle.stop()
        await server.stop()
