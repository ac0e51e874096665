"""Loopback helpers shared by the tests that start real servers (tests/ is on sys.path
through its conftest.py). Ports come from below the kernel's ephemeral range
(psyche_common.local_ports): a server started after the pick cannot find its port taken
by some outgoing connection in between."""

from __future__ import annotations

from psyche_common.local_ports import free_ports, port_is_free

ATTEMPTS = 50


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    [port] = free_ports(1)
    return port


def free_base_port(count: int) -> int:
    """A base whose base + 1 .. base + count are all free now (a testnet's metrics ports)."""
    for _ in range(ATTEMPTS):
        base = free_port() - 1
        if all(port_is_free(base + i) for i in range(2, count + 1)):
            return base
    raise AssertionError(f"no {count} consecutive free ports on loopback in {ATTEMPTS} tries")
