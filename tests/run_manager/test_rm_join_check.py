"""Before the client container starts, the run-manager asks whether the client can join
(Psyche's can-join on a real local validator; a finished run on a real TCP coordinator)
and stops with the reason instead of starting a client that can only be refused. A
client that the coordinator refused for good (exit 11) is not restarted either."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import docker
import pytest
from loopback import free_port
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from tcp_run import RUN_ID, state_file

from coordinator import Coordinator, RunState
from coordinator_tcp import CoordinatorServer, ServerOptions
from psyche_common.exit_codes import CLIENT_EXIT_REFUSED, CLIENT_EXIT_VERSION_MISMATCH
from psyche_common.metrics_source import HttpClientMetricsSource
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import SolanaRpc
from psyche_solana.runs import authorize
from run_manager.docker_supervisor import (
    ContainerStarted,
    Supervisor,
    SupervisorConfig,
    SupervisorEvent,
    SupervisorFinished,
)
from run_manager.join_check import FinishedRunCheck, SolanaJoinCheck
from run_manager.monitor import Monitor
from run_manager.runner import run_headless
from run_manager.sources import PinnedVersionSource, TcpCoordinatorSource
from run_manager.view import Dashboard
from tests.run_manager.test_rm_discovery import open_run

pytestmark = pytest.mark.timeout(120)
OWNER, CLOSER, STRANGER = Keypair(), Keypair(), Keypair()  # CLOSER authorizes nobody


@pytest.fixture(scope="module")
def localnet() -> Iterator[Localnet]:
    """"open": permissionless and running; "closed": no authorization for STRANGER;
    "halted": permissionless, never resumed (a client may join and wait)."""
    with Localnet() as net:
        async def setup() -> None:
            async with SolanaRpc([net.url]) as rpc:
                for key in (OWNER, CLOSER):
                    await rpc.airdrop(key.pubkey(), 50 * 10**9)
                await authorize(rpc, OWNER, Pubkey.default())
                await open_run(rpc, OWNER, "open", resume=True)
                await open_run(rpc, OWNER, "halted", resume=False)
                await open_run(rpc, CLOSER, "closed", resume=True)

        asyncio.run(setup())
        yield net


def engine_that_is_not_there() -> docker.DockerClient:
    """A real Docker client for an engine that does not exist: any container call would
    fail, so a test that passes shows the supervisor never reached for one. The API
    version is given so that creating the client asks the engine nothing."""
    return docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")


async def check(net: Localnet, run_id: str, who: Keypair) -> object:
    join = SolanaJoinCheck([net.url], run_id, str(who.pubkey()))
    try:
        return await join.refusal()
    finally:
        await join.close()


async def test_can_join_on_solana_allows_an_open_run_and_a_halted_one(localnet: Localnet) -> None:
    assert await check(localnet, "open", STRANGER) is None
    assert await check(localnet, "halted", STRANGER) is None  # joins, then waits for resume


async def test_can_join_on_solana_refuses_a_wallet_without_authorization(localnet: Localnet) -> None:
    refusal = await check(localnet, "closed", STRANGER)
    assert refusal is not None and refusal.reason == "not-authorized"  # type: ignore[attr-defined]  # a Refusal
    assert "no active join authorization" in refusal.message  # type: ignore[attr-defined]  # a Refusal
    assert str(STRANGER.pubkey()) in refusal.message  # type: ignore[attr-defined]  # a Refusal


async def test_an_unauthorized_wallet_gets_no_container_and_the_reason(localnet: Localnet) -> None:
    events: list[SupervisorEvent] = []
    join = SolanaJoinCheck([localnet.url], "closed", str(STRANGER.pubkey()))
    config = SupervisorConfig(run_id="closed", backoff_base_s=0.1)
    out = io.StringIO()
    dashboard = Dashboard()
    metrics = HttpClientMetricsSource(free_port())  # no client: nothing listens there

    def supervisor(on_event: Callable[[SupervisorEvent], None]) -> Supervisor:
        def recorded(event: SupervisorEvent) -> None:
            events.append(event)
            on_event(event)

        return Supervisor(engine_that_is_not_there(), PinnedVersionSource("1"), config,
                          recorded, join)

    try:
        finished = await asyncio.wait_for(run_headless(
            supervisor,
            lambda on_change: Monitor(dashboard, PinnedVersionSource("1"), metrics, on_change),
            dashboard, out), timeout=60)
    finally:
        await join.close()
        await metrics.close()
    assert finished.reason == "not-authorized" and finished.failed
    assert not any(isinstance(e, ContainerStarted) for e in events)
    assert events[-1] == finished
    printed = out.getvalue()
    assert "[container] container —: not-authorized" in printed
    assert "not authorized to join run 'closed'" in printed


@contextlib.asynccontextmanager
async def finished_coordinator() -> AsyncIterator[CoordinatorServer]:
    coordinator = Coordinator.from_state_file(state_file("0.1.0"))
    coordinator.state.run_state = RunState.Finished  # a run played to its end
    server = CoordinatorServer(coordinator, ServerOptions(host="127.0.0.1", port=0,
                                                          tick_interval_s=0.05))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_a_finished_tcp_run_starts_no_client() -> None:
    async with finished_coordinator() as server:
        source = TcpCoordinatorSource(f"127.0.0.1:{server.port}", RUN_ID, wait_s=10)
        try:
            supervisor = Supervisor(engine_that_is_not_there(), source,
                                    SupervisorConfig(run_id=RUN_ID), lambda e: None,
                                    FinishedRunCheck(source, RUN_ID))
            finished = await asyncio.wait_for(supervisor.run(), timeout=30)
        finally:
            await source.close()
    assert finished.reason == "run-finished" and not finished.failed
    assert "has finished" in finished.message


def test_exit_11_is_final_with_the_clients_own_error_line() -> None:
    supervisor = Supervisor(engine_that_is_not_there(), PinnedVersionSource("1"),
                            SupervisorConfig(run_id="r"), lambda e: None)
    supervisor._report_log_line("error: the coordinator refused this client: NotAuthorized: x")
    final = supervisor._final_exit(CLIENT_EXIT_REFUSED)
    assert final is not None and final.reason == "refused" and final.failed
    assert final.message.endswith("NotAuthorized: x")
    assert supervisor._final_exit(CLIENT_EXIT_VERSION_MISMATCH) is None  # restarts
    assert supervisor._final_exit(1) is None  # a crash: restarts with backoff
    assert SupervisorFinished("client-finished", "").failed is False



async def test_the_tui_shows_the_refusal_and_stays_until_the_operator_quits(
        localnet: Localnet) -> None:
    from textual.widgets import Static

    from run_manager.tui.app import RunManagerApp

    join = SolanaJoinCheck([localnet.url], "closed", str(STRANGER.pubkey()))
    app = RunManagerApp(Dashboard(), lambda on_event: Supervisor(
        engine_that_is_not_there(), PinnedVersionSource("1"), SupervisorConfig(run_id="closed"),
        on_event, join))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(100):
                if app.finished is not None:
                    break
                await pilot.pause(0.05)
            await pilot.pause()
            assert app.finished is not None and app.finished.reason == "not-authorized"
            panel = str(app.query_one("#container-summary", Static).render())
            assert "not-authorized" in panel and "not authorized to join run" in panel
            assert app.is_running  # the reason stays on screen
            await pilot.press("q")
            await pilot.pause()
            assert not app.is_running
    finally:
        await join.close()


def test_the_client_refused_for_good_exits_11_with_its_reason(localnet: Localnet) -> None:
    """The real client process, joining a run that has not authorized its wallet: the exit
    code the supervisor reads as final (not a crash to restart), and the line it shows."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    wallet = str(list(bytes(STRANGER))).replace(" ", "")
    env = {**os.environ, "RAW_WALLET_PRIVATE_KEY": wallet}
    env.pop("RPC", None)
    client = Path(sys.executable).with_name("psyche-client")
    result = subprocess.run(
        [str(client), "train", "--rpc", localnet.url, "--run-id", "closed", "--logs", "json",
         "--bind-p2p-interface", "lo"],
        env=env, capture_output=True, text=True, timeout=90, check=False)
    assert result.returncode == CLIENT_EXIT_REFUSED, result.stderr[-2000:]
    assert "error: the coordinator refused this client: NotAuthorized" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_run_manager_cli_stops_an_unauthorized_wallet_before_any_container(
        localnet: Localnet, tmp_path: Path, docker_client: docker.DockerClient,
        client_image: str, run_id: str, no_leftover_containers: None) -> None:
    """`run-manager --env-file run.env --no-tui` with a real engine and a real validator:
    the check comes first, the reason is the last line, exit 1, nothing was started."""
    import subprocess
    import sys

    from run_manager import engine

    env = tmp_path / "run.env"
    env.write_text(f"RPC={localnet.url}\nWS_RPC=ws://127.0.0.1:1\nRUN_ID=closed\n"
                   f"RAW_WALLET_PRIVATE_KEY={STRANGER}\n")
    result = subprocess.run(
        [str(Path(sys.executable).with_name("run-manager")), "--env-file", str(env), "--no-tui",
         "--local", "--client-version", client_image.rpartition(":")[2]],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stderr
    assert "[container] container —: not-authorized" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith(
        "run-manager: not authorized to join run 'closed': no active join authorization")
    assert "Traceback" not in result.stderr
    assert engine.find_managed_containers(docker_client, "closed") == []
