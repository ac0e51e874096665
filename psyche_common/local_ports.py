"""Ports on this host: whether one is taken, and ports the system has free now. The
testnet and the run-manager both pick a default port, or a free one when a second run on
the host holds it (local_testnet/ports.py, run_manager/host_conflicts.py)."""

from __future__ import annotations

import errno
import socket


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """False only when something listens there (not when, say, a low port needs root)."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.errno != errno.EADDRINUSE
    return True


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports the system has free now (all bound at once, so distinct)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((host, 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()
