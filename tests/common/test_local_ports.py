"""Ports picked now and listened on later come from below the kernel's ephemeral range,
where no outgoing connection can take them in between (a CI failure: a testnet client's
metrics port, picked by binding port 0, was in use by the time the client started)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

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
