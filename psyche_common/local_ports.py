"""Ports on this host: whether one is taken, and ports the system has free now. The
testnet and the run-manager both pick a default port, or a free one when a second run on
the host holds it (local_testnet/ports.py, run_manager/host_conflicts.py).

A port picked now is listened on later (a client starts seconds after), so it is picked
below the kernel's ephemeral range: a port from that range (what binding port 0 gives) can
meanwhile become the source port of any outgoing connection on the host, and the listener
that comes later fails with "Address already in use" (seen in CI: a testnet client's
metrics port taken between the pick and the client's start)."""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL_LOW = 32768
LOWEST_PICKED_PORT = 10000  # above the well-known and most registered services' ports


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """False only when something listens there (not when, say, a low port needs root).

    The probe binds as a server does (SO_REUSEADDR, as asyncio's start_server and the
    client's metrics server do): closed connections left in TIME-WAIT on the port (a
    stopped client's metrics server, polled by the TUI, closes first and keeps them for
    about a minute) do not stop a listener, so they do not count as in use."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.errno != errno.EADDRINUSE
    return True


def ephemeral_range_low(range_file: Path = EPHEMERAL_RANGE_FILE) -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux's default where
    the file is missing or unreadable)."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LINUX_DEFAULT_EPHEMERAL_LOW


def free_ports(count: int, host: str = "127.0.0.1", *,
               rng: random.Random | None = None) -> list[int]:
    """`count` distinct ports free now, below the ephemeral range (see the module's note):
    tried from a random point of [10000, low) onwards so that two runs picking at the same
    moment rarely try the same ones; all held at once while picking, so distinct. Falls back
    to ports the system picks when that range has too few free."""
    low = ephemeral_range_low()
    span = low - LOWEST_PICKED_PORT
    held: list[socket.socket] = []
    try:
        if span > count:
            start = (rng or random.Random()).randrange(span)
            for offset in range(span):
                if len(held) == count:
                    break
                probe = socket.socket()
                try:
                    probe.bind((host, LOWEST_PICKED_PORT + (start + offset) % span))
                except OSError:
                    probe.close()
                    continue
                held.append(probe)
        while len(held) < count:
            probe = socket.socket()
            held.append(probe)
            probe.bind((host, 0))
        return [int(probe.getsockname()[1]) for probe in held]
    finally:
        for probe in held:
            probe.close()
