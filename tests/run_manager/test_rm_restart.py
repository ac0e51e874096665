"""A stop followed at once by a start with the same env file works (issue 35, item 1): the
closed metrics connections left in TIME-WAIT on METRICS_LOCAL_PORT do not make it "in
use", and after a `kill -9` of the run-manager its orphaned client container (which holds
the port) is removed as a leftover before the port is checked. Real run-manager processes,
a real engine, the real client image."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import docker
import pytest
from loopback import free_port
from test_rm_stops import STOP_WITHIN_S, RunManager, version_of

from psyche_common.local_ports import port_is_free
from run_manager import engine

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_containers"),
              pytest.mark.timeout(600)]


def poll_metrics(port: int) -> None:
    """One request as the TUI's polling makes; read to the end, so the client's server
    closes first and the host keeps a TIME-WAIT connection on the metrics port."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]


def time_wait_on(port: int) -> bool:
    """Whether some connection on local port `port` is in TIME-WAIT (/proc/net/tcp's
    state 06), i.e. what a probe without SO_REUSEADDR took for "in use"."""
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return any(int(row[1].split(":")[1], 16) == port and row[3] == "06" for row in rows)


async def test_a_restart_after_a_stop_or_a_kill_9_gets_its_metrics_port(
    docker_client: docker.DockerClient, client_image: str, run_id: str, tmp_path: Path,
) -> None:  # fmt: skip
    port = free_port()
    env_file = tmp_path / "run.env"
    env_file.write_text(  # nobody listens at the coordinator's address: the client retries
        f"RUN_ID={run_id}\nCOORDINATOR_ADDRESS=127.0.0.1:{free_port()}\nGPUS=none\n"
        f"IROH_RELAY=disabled\nTORCH_THREADS=1\nMAX_CRASH_RESTARTS=0\nMETRICS_LOCAL_PORT={port}\n")
    version = version_of(client_image)
    managers = [RunManager(tmp_path / name) for name in ("first", "second", "third")]
    for manager in managers:
        manager.log.parent.mkdir()
    first, second, third = managers
    try:
        first.start(env_file, "--client-version", version)
        await first.wait_for_line("coordinator connection lost")  # its metrics server is up
        assert first.process is not None
        [orphan] = engine.find_managed_containers(docker_client, run_id)
        os.kill(first.process.pid, signal.SIGKILL)  # the run-manager only: its client lives on
        first.process.wait(10)
        orphan.reload()
        assert orphan.status == "running" and not port_is_free(port)

        second.start(env_file, "--client-version", version)
        await second.wait_for_line("coordinator connection lost")
        output = second.output()
        assert (f"run-manager: removed leftover container {orphan.name} (running) of "
                f"run-manager pid {first.process.pid}, which is gone") in output
        assert "is in use" not in output
        [client] = engine.find_managed_containers(docker_client, run_id)
        assert client.id != orphan.id
        for _ in range(3):
            poll_metrics(port)
        assert second.process is not None
        second.process.send_signal(signal.SIGINT)
        assert second.process.wait(STOP_WITHIN_S + 10) == 0, second.output()[-3000:]
        assert time_wait_on(port)  # what made the restart fail for about a minute

        third.start(env_file, "--client-version", version)  # at once, same env file
        await third.wait_for_line("coordinator connection lost")
        assert "is in use" not in third.output()
        poll_metrics(port)  # its client listens on the same port
        assert third.process is not None
        third.process.send_signal(signal.SIGINT)
        assert third.process.wait(STOP_WITHIN_S + 10) == 0, third.output()[-3000:]
    finally:
        for manager in managers:
            manager.kill()


def test_a_port_with_a_listener_is_still_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert not port_is_free(taken.getsockname()[1])
