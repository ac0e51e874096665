"""The client under the rule that only the run's authority sets its checkpoint repository
(a report may only name a new revision of it): reports of uploads to the run's repository
are accepted; uploads elsewhere are not reported, with one warning each; a report the
coordinator refuses anyway is one `coordinator_error`, never a crash or a retry; and a
client started with a foreign --hub-repo says so once."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from runner_swarm import FakeSwarm
from tcp_helpers import RUN_ID, Clock, make_state_file, server_options, wait_for

from client_image import training
from client_image.backends.base import ServerState
from client_image.backends.tcp import TcpBackend
from client_image.client_config import ClientConfig
from client_image.p2p import NodeConfig
from client_image.runtime.client import ClientOptions, PsycheClient
from client_image.runtime.events import (
    CheckpointNotReported,
    HubRepoNotRunRepository,
    TaskFailed,
    Uploaded,
)
from client_image.runtime.observability import EventLog
from coordinator import Coordinator, CoordinatorState, RunState
from coordinator.config import HubCheckpoint, P2PCheckpoint
from coordinator.messages import CheckpointReport, Refusal
from coordinator_tcp.server import CoordinatorServer
from psyche_common.identity import Identity

RUN_REPO = "assets/tiny-llama"  # the local testnet's checkpoint
FAST = {"epoch_time": 12, "warmup_time": 5, "max_round_train_time": 5}


def commit_of(step: int) -> str:
    return f"{step:040x}"


@pytest.fixture
def uploads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Uploads succeed at once, with the commit id `commit_of(step)`."""
    done: list[tuple[str, int]] = []

    def upload(path: Path, repo: str, step: int, *, token: str | None = None) -> str:
        done.append((repo, step))
        return commit_of(step)

    monkeypatch.setattr(training, "upload_checkpoint", upload)
    return done


def reports(swarm: FakeSwarm) -> list[tuple[Any, object]]:
    return [(m, result) for _, m, result in swarm.sent if isinstance(m, CheckpointReport)]


async def through_cooldown(swarm: FakeSwarm) -> None:
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown)
    await swarm.drain()  # the cooldown tasks, uploads included


async def test_reports_of_the_runs_repository_advance_its_revision(
        tmp_path: Path, uploads: list[tuple[str, int]]) -> None:
    swarm = FakeSwarm(3, checkpoint_dir=tmp_path, hub_repo=RUN_REPO, **FAST)
    await through_cooldown(swarm)
    await swarm.run_until(lambda s: len(reports(s)) == 3)
    step = uploads[0][1]
    assert uploads == [(RUN_REPO, step)] * 3
    assert [result for _, result in reports(swarm)] == [None] * 3
    checkpoint = swarm.coordinator.state.model.checkpoint
    assert isinstance(checkpoint, HubCheckpoint | P2PCheckpoint)
    assert (checkpoint.repo_id, checkpoint.revision) == (RUN_REPO, commit_of(step))
    assert not swarm.events_of(CheckpointNotReported)


async def test_an_upload_elsewhere_is_not_reported_and_warns_once(
        tmp_path: Path, uploads: list[tuple[str, int]]) -> None:
    swarm = FakeSwarm(3, checkpoint_dir=tmp_path, hub_repo="someone/else", **FAST)
    await through_cooldown(swarm)
    for _ in range(20):
        await swarm.turn()
    assert len(swarm.events_of(Uploaded)) == 3  # the upload itself is kept
    assert not reports(swarm)
    assert not [m for _, m in swarm.inbox if isinstance(m, CheckpointReport)]
    for who in swarm.nodes:
        [warning] = swarm.events_of(CheckpointNotReported, who)
        assert warning.error == "CheckpointNotRunRepository"
        assert "'someone/else'" in warning.detail and f"'{RUN_REPO}'" in warning.detail
    assert swarm.coordinator.state.model.checkpoint.revision is None  # type: ignore[union-attr]  # a Hub or P2P checkpoint here


async def test_a_refused_report_is_not_retried_and_the_run_goes_on(
        tmp_path: Path, uploads: list[tuple[str, int]]) -> None:
    swarm = FakeSwarm(3, checkpoint_dir=tmp_path, hub_repo=RUN_REPO, **FAST)
    await through_cooldown(swarm)
    # The authority moved the repository after the clients looked (e.g. a paused run).
    state = swarm.coordinator.state
    state.model = state.model.model_copy(update={"checkpoint": HubCheckpoint(repo_id="org/new")})
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.run_state is RunState.RoundTrain)
    refused = [result for _, result in reports(swarm)]
    assert len(refused) == 3  # one each, no retry
    assert all(r is not None and r.error.name == "CheckpointNotRunRepository"  # type: ignore[attr-defined]  # a Rejected
               for r in refused)
    assert not swarm.events_of(TaskFailed)


async def test_the_tcp_backend_hands_the_refusal_to_the_client_and_keeps_going() -> None:
    clock = Clock(2_000_000.0)
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file()), server_options(),
                               clock=clock)
    await server.start()
    me = Identity(bytes(31) + b"\x07")
    backend = TcpBackend(f"127.0.0.1:{server.port}", me, RUN_ID, f"{me.node_id}@127.0.0.1:1")
    states: list[CoordinatorState] = []
    errors: list[Refusal] = []
    stop = asyncio.Event()

    async def on_state(server_state: ServerState) -> None:
        states.append(server_state.state)

    task = asyncio.create_task(backend.run(on_state, errors.append, stop))
    try:
        await wait_for(lambda: states)
        clock.now += 2
        await wait_for(lambda: states[-1].run_state is RunState.Warmup)
        report = CheckpointReport(index=0, repo=HubCheckpoint(repo_id="someone/else",
                                                               revision="r"))
        assert await backend.report_checkpoint(report)
        await wait_for(lambda: errors)
        assert [e.error for e in errors] == ["CheckpointNotRunRepository"]
        assert isinstance(errors[0], Refusal)  # the runtime's type, not the TCP wire's
        assert backend.connected.is_set()  # not a fatal refusal: the connection stays
        assert "the run's checkpoint is Hub repository" in errors[0].detail
        seen = len(states)
        clock.now += 20
        await wait_for(lambda: len(states) > seen)  # still following the run
        assert not task.done()
    finally:
        stop.set()
        task.cancel()  # as the client does: a session ends with the connection
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop()


class _Runner:
    def on_state(self, state: CoordinatorState, previous: CoordinatorState | None) -> None:
        pass


@pytest.mark.parametrize(("hub_repo", "warned"), [("someone/else", True), (RUN_REPO, False),
                                                  (None, False)])
async def test_a_foreign_hub_repo_is_named_once_at_start(hub_repo: str | None,
                                                         warned: bool) -> None:
    events: list[object] = []
    log = EventLog("none")
    log.listeners.append(events.append)
    client = PsycheClient(ClientOptions(ClientConfig.of(run_id=RUN_ID, device="cpu",
                                                        hub_repo=hub_repo),
                                        identity=Identity.generate(),
                                        node_config=NodeConfig.loopback()),
                          log)
    client.runner = _Runner()  # type: ignore[assignment]  # only on_state is called here
    state = Coordinator.from_state_file(make_state_file()).state
    try:
        for now in (1, 2):  # the first state, then another: one warning in all
            state.progress.step = now
            await client._on_state(ServerState(state, {}, now))
    finally:
        client.worker.close()
    found = [e for e in events if isinstance(e, HubRepoNotRunRepository)]
    assert len(found) == (1 if warned else 0)
    if warned:
        assert found[0].error == "CheckpointNotRunRepository"
        assert found[0].run_checkpoint == f"Hub repository '{RUN_REPO}'"
        assert "will refuse" in found[0].detail
