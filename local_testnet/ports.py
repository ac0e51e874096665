"""The ports a testnet's clients serve their metrics on: client i on base + i, by default
from 6269 as Psyche's clients; when one of those is taken (a second testnet on this host),
ports the system picks instead, and the testnet says which. A base the user chose must be
free: a taken one is an error, not a silent move."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.config import ConfigError
from psyche_common.local_ports import free_ports, port_is_free

METRICS_BASE_PORT = 6269
SERVER_PORT = 20000


@dataclass(frozen=True)
class MetricsPorts:
    ports: dict[int, int]  # client number (1..N) -> its metrics port
    note: str | None  # set when the default range was taken and other ports were picked


def pick_server_port(chosen: int | None) -> tuple[int, str | None]:
    """The coordinator's port: the one chosen; else 20000, or a free port when 20000 is
    taken, with the line saying so."""
    if chosen is not None or port_is_free(SERVER_PORT):
        return (SERVER_PORT if chosen is None else chosen), None
    [port] = free_ports(1)
    return port, (f"port {SERVER_PORT} is in use (another run on this host?): the coordinator "
                  f"listens on {port} instead")


def taken_run_ports(server_port: int, data_address: str | None) -> list[str]:
    """One line per port of the run that something on this host already listens on."""
    problems = []
    if not port_is_free(server_port):
        problems.append(f"--server-port {server_port} is in use (another run on this host?): "
                        "choose another, or leave it out")
    if data_address is not None:
        port = int(data_address.rpartition(":")[2])
        if not port_is_free(port):
            problems.append(f"the data server's port {port} (the config's {data_address}) is "
                            "in use: choose another with --data-port")
    return problems


def pick_metrics_ports(base: int | None, num_clients: int) -> MetricsPorts:
    """base + 1 .. base + N; with no base, 6270.. when every one is free, else free ports.
    Raises ConfigError naming the first taken port of a chosen base."""
    wanted = {i: (METRICS_BASE_PORT if base is None else base) + i
              for i in range(1, num_clients + 1)}
    taken = [port for port in wanted.values() if not port_is_free(port)]
    if not taken:
        return MetricsPorts(wanted, None)
    if base is not None:
        raise ConfigError([f"--metrics-base-port {base}: port {taken[0]} (a client's metrics "
                           "port) is in use; choose another base or leave it out"])
    picked = free_ports(num_clients)
    ports = dict(zip(wanted, picked, strict=True))
    shown = ", ".join(str(port) for port in picked)
    return MetricsPorts(ports, f"port {taken[0]} is in use (another run on this host?): "
                               f"client metrics on ports {shown} instead")
