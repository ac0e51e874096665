"""What a second run-manager on the same host must not take from the first: the client's
metrics port (the container shares the host's network) and the run's container (a
run-manager removes its run's leftover containers before it starts one, so a second one for
the same RUN_ID would remove the first one's running client)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import docker

from psyche_common.local_ports import free_ports, port_is_free
from run_manager import engine

DEFAULT_METRICS_PORT = 6269  # Psyche's METRICS_LOCAL_PORT
OWNER_PID_LABEL = "io.psyche.run-manager-pid"  # set on every container the supervisor starts


class PortTaken(ValueError):
    """A metrics port the user chose is in use: one line naming it."""


class ManagedElsewhere(Exception):
    """Another live run-manager on this host runs this run's client: one line naming it."""


@dataclass(frozen=True)
class MetricsPortChoice:
    port: int
    moved: str | None  # when 6269 was taken: the line saying which port, and why


def choose_metrics_port(chosen: int | None) -> MetricsPortChoice:
    """The port the client serves its metrics on: the one chosen (--metrics-local-port or
    METRICS_LOCAL_PORT), which must be free; else 6269, or a free port when 6269 is taken."""
    if chosen is not None:
        if not port_is_free(chosen):
            raise PortTaken(f"METRICS_LOCAL_PORT {chosen} is in use on 127.0.0.1 (another "
                            "client on this host?); choose another or leave it unset")
        return MetricsPortChoice(chosen, None)
    if port_is_free(DEFAULT_METRICS_PORT):
        return MetricsPortChoice(DEFAULT_METRICS_PORT, None)
    [port] = free_ports(1)
    return MetricsPortChoice(port, f"port {DEFAULT_METRICS_PORT} is in use (another run on "
                                   f"this host?): client metrics on 127.0.0.1:{port}")


def _run_manager_alive(pid: int) -> bool:
    """Whether `pid` is a live run-manager process on this host (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"run-manager" in cmdline or b"run_manager" in cmdline


def run_managed_elsewhere(client: docker.DockerClient, run_id: str) -> str | None:
    """A one-line refusal when another live run-manager on this host runs this run's
    client container; None when there is none (leftovers of a dead one are stale)."""
    for container in engine.find_managed_containers(client, run_id):
        owner = container.labels.get(OWNER_PID_LABEL, "")
        if container.status not in ("running", "restarting", "created"):
            continue
        if not owner.isdigit() or int(owner) == os.getpid() or not _run_manager_alive(int(owner)):
            continue
        return (f"run {run_id!r} already has a client on this host: container {container.name} "
                f"({container.status}), managed by run-manager pid {owner}; stop that one "
                "first (one client per run and host)")
    return None


def clear_host_for_run(client: docker.DockerClient, run_id: str) -> list[str]:
    """Before the metrics port is checked: refuses (ManagedElsewhere) when a live
    run-manager here runs this run's client, else removes this run's leftover containers
    (a run-manager killed with SIGKILL leaves its client running, holding the metrics
    port, which would otherwise make the port check fail first). Lines saying what went."""
    if (elsewhere := run_managed_elsewhere(client, run_id)) is not None:
        raise ManagedElsewhere(elsewhere)
    removed = []
    for leftover in engine.find_managed_containers(client, run_id):
        owner = leftover.labels.get(OWNER_PID_LABEL, "?")
        engine.remove_container(leftover)
        removed.append(f"removed leftover container {leftover.name} ({leftover.status}) of "
                       f"run-manager pid {owner}, which is gone")
    return removed
