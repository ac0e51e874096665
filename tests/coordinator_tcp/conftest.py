"""Fixtures of the TCP backend tests (helpers live in tcp_helpers.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from tcp_helpers import Clock, make_state_file, server_options

from coordinator import Coordinator
from coordinator_tcp.server import CoordinatorServer


@pytest.fixture
async def server() -> AsyncIterator[CoordinatorServer]:
    instance = CoordinatorServer(Coordinator.from_state_file(make_state_file()), server_options())
    await instance.start()
    try:
        yield instance
    finally:
        await instance.stop()


@pytest.fixture
async def clocked() -> AsyncIterator[tuple[CoordinatorServer, Clock]]:
    """A started server whose clock moves only when the test advances it."""
    clock = Clock()
    instance = CoordinatorServer(Coordinator.from_state_file(make_state_file()),
                                 server_options(), clock=clock)
    await instance.start()
    try:
        yield instance, clock
    finally:
        await instance.stop()
