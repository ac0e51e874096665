"""Ports picked now and listened on later come from below the kernel's ephemeral range,
where no outgoing connection can take them in between (a CI failure: a testnet client's
metrics port, picked by binding port 0, was in use by the time the client started)."""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

import pytest

from psyche_common.local_ports import (
    LINUX_DEFAULT_EPHEMERAL_LOW,
    LOWEST_PICKED_PORT,
    ephemeral_range_low,
    free_ports,
    port_is_free,
)


def test_picked_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    low = ephemeral_range_low()
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(LOWEST_PICKED_PORT <= port < low for port in ports)
    assert all(port_is_free(port) for port in ports)


def test_a_taken_port_is_passed_over() -> None:
    # The same random start twice: the first pick is held, the second must step past it.
    [taken] = free_ports(1, rng=random.Random(7))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        [other] = free_ports(1, rng=random.Random(7))
    assert other != taken and LOWEST_PICKED_PORT <= other < ephemeral_range_low()


def test_the_range_file_missing_or_garbled_means_linux_defaults(tmp_path: Path) -> None:
    assert ephemeral_range_low(tmp_path / "absent") == LINUX_DEFAULT_EPHEMERAL_LOW
    garbled = tmp_path / "range"
    garbled.write_text("not a number\n")
    assert ephemeral_range_low(garbled) == LINUX_DEFAULT_EPHEMERAL_LOW
    garbled.write_text("40000\t60999\n")
    assert ephemeral_range_low(garbled) == 40000


def time_wait_on(port_holder: socket.socket) -> None:
    """Leaves a connection in TIME-WAIT on the holder's port: the server side, which
    closes first (as the client's metrics server does after each answer), keeps it."""
    with socket.create_connection(port_holder.getsockname()) as outgoing:
        accepted, _ = port_holder.accept()
        accepted.close()  # the server side closes first: its end goes to TIME-WAIT
        outgoing.recv(1)  # the FIN arrived
    port_holder.close()


def test_time_wait_connections_do_not_make_a_port_in_use() -> None:
    [port] = free_ports(1)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    assert not port_is_free(port)  # a listener: in use
    time_wait_on(listener)
    # The TIME-WAIT is there: a bind without SO_REUSEADDR still fails...
    with socket.socket() as plain, pytest.raises(OSError) as refused:
        plain.bind(("127.0.0.1", port))
    assert refused.value.errno == errno.EADDRINUSE
    # ...but nothing listens, and a server (which binds with reuse) can listen there.
    assert port_is_free(port)
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        assert not port_is_free(port)


async def test_the_client_metrics_server_listens_over_time_wait_connections() -> None:
    from client_image.runtime.observability import MetricsServer

    [port] = free_ports(1)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    time_wait_on(listener)
    server = MetricsServer(port, render=lambda: None)
    await server.start()  # raised MetricsPortInUse without reuse
    try:
        assert not port_is_free(port)
    finally:
        await server.stop()
