"""A Hub checkpoint report is applied only when its commit is on the main branch of the
run's repository (coordinator_tcp/checkpoint_history.py), against a real Hub API server
on loopback (tests/hub_emulator.py) asked through huggingface_hub itself."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hub_emulator import HubEmulator, hub_emulator
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError
from tcp_helpers import identity, join, make_state_file, server_options, wait_for
from typer.testing import CliRunner

from coordinator import Coordinator
from coordinator.config import HubCheckpoint, P2PCheckpoint
from coordinator_tcp.checkpoint_history import HubHistory
from coordinator_tcp.cli import app
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.protocol import CheckpointReport, ErrorReply
from coordinator_tcp.server import CoordinatorServer

REPO = "assets/tiny-llama"  # the local-testnet run's checkpoint repository


@pytest.fixture
def hub() -> Iterator[HubEmulator]:
    with hub_emulator() as emulator:
        emulator.commit(REPO, {"config.json": b"{}"}, title="initial")
        emulator.commit(REPO, {"model.safetensors": b"step 1"}, title="epoch 0")
        emulator.commit(REPO, {"model.safetensors": b"step 2"}, title="epoch 1")
        yield emulator


def main_head(hub: HubEmulator) -> str:
    return hub.repos[REPO].refs["main"]


# ---------------------------------------------------------------- the emulator itself
def test_emulator_answers_huggingface_hub(hub: HubEmulator, tmp_path: Path) -> None:
    pr = hub.commit(REPO, {"model.safetensors": b"someone else's"}, ref="refs/pr/1")
    api = HfApi(endpoint=hub.endpoint)
    main = [c.commit_id for c in api.list_repo_commits(REPO)]
    assert main[0] == main_head(hub) and len(main) == 3  # two pages of two
    assert [c.title for c in api.list_repo_commits(REPO)] == ["epoch 1", "epoch 0", "initial"]
    assert [c.commit_id for c in api.list_repo_commits(REPO, revision="refs/pr/1")] == [pr, *main]
    assert api.model_info(REPO, revision=pr).sha == pr
    assert api.repo_info(REPO).sha == main[0]
    assert {s.rfilename for s in api.model_info(REPO).siblings or []} == {
        "config.json", "model.safetensors"}
    path = hf_hub_download(REPO, "model.safetensors", revision=pr, cache_dir=tmp_path,
                           endpoint=hub.endpoint)
    assert Path(path).read_bytes() == b"someone else's"
    assert f"/{pr}/" in path.replace("\\", "/")  # cached under the X-Repo-Commit it sent
    path = hf_hub_download(REPO, "model.safetensors", cache_dir=tmp_path, endpoint=hub.endpoint)
    assert Path(path).read_bytes() == b"step 2"
    folder = Path(snapshot_download(REPO, revision=pr, cache_dir=tmp_path / "snapshots",
                                    endpoint=hub.endpoint))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {
        "config.json": b"{}", "model.safetensors": b"someone else's"}
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="0" * 40)
    with pytest.raises(RepositoryNotFoundError):
        api.list_repo_commits("nobody/nothing")


# ---------------------------------------------------------------- HubHistory
async def test_hub_history_tells_main_from_a_pull_request(hub: HubEmulator) -> None:
    pr = hub.commit(REPO, {"model.safetensors": b"mine"}, ref="refs/pr/1")
    history = HubHistory(hub.endpoint, timeout_s=10)
    main = hub.repos[REPO].resolve("main")
    assert main is not None
    first = hub.repos[REPO].history(main)[-1].id
    assert await history.on_main(REPO, main_head(hub)) is None
    assert not any("/commits/" in r for r in hub.requests)  # main's head: one model_info
    assert await history.on_main(REPO, first) is None  # an older commit of main
    assert any("/commits/main" in r for r in hub.requests)
    asked = len(hub.requests)
    assert await history.on_main(REPO, first) is None
    assert len(hub.requests) == asked  # main's commits are remembered
    refused = await history.on_main(REPO, pr)
    assert refused is not None and "not on its main branch" in refused and "refs/pr" in refused
    unknown = await history.on_main(REPO, "f" * 40)
    assert unknown == f"Hub repository {REPO!r} at {hub.endpoint} has no commit {'f' * 40}"
    asked = len(hub.requests)
    assert await history.on_main(REPO, pr) == refused  # remembered for a while
    assert len(hub.requests) == asked
    missing = await history.on_main("nobody/nothing", main_head(hub))
    assert missing is not None and "was not found" in missing


async def test_hub_history_refuses_when_the_hub_is_gone(hub: HubEmulator) -> None:
    history = HubHistory(hub.endpoint, timeout_s=5.0)
    hub.stop()
    started = asyncio.get_running_loop().time()
    refused = await history.on_main(REPO, main_head(hub))
    assert asyncio.get_running_loop().time() - started < 3  # refused at once, no retries
    assert refused is not None and "\n" not in refused
    assert "the Hub did not answer (ConnectError" in refused
    assert history.refused == {}  # asked again next time


async def test_hub_history_refuses_when_the_hub_hangs() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        history = HubHistory(endpoint, timeout_s=1.0)
        started = asyncio.get_running_loop().time()
        refused = await history.on_main(REPO, "a" * 40)
        assert asyncio.get_running_loop().time() - started < 3
    assert refused is not None and "\n" not in refused
    assert endpoint in refused and "did not answer" in refused


# ---------------------------------------------------------------- the TCP server
@pytest.fixture
async def served(hub: HubEmulator) -> AsyncIterator[tuple[CoordinatorServer, ProtocolConnection]]:
    """A started server whose Hub is the emulator, with one client listed at index 0."""
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file()), server_options(),
                               checkpoint_history=HubHistory(hub.endpoint, timeout_s=1.0))
    await server.start()
    connection = await join(server, identity(1))
    try:
        await wait_for(lambda: len(server.state.epoch_state.clients) == 1, timeout_s=10)
        yield server, connection
    finally:
        await connection.close()
        await server.stop()


def revision(server: CoordinatorServer) -> str | None:
    checkpoint = server.state.model.checkpoint
    return checkpoint.revision if isinstance(checkpoint, HubCheckpoint | P2PCheckpoint) else None


def report(commit: str, repo_id: str = REPO) -> CheckpointReport:
    return CheckpointReport(index=0, hub=HubCheckpoint(repo_id=repo_id, revision=commit))


async def refusal(connection: ProtocolConnection) -> ErrorReply:
    async def wait() -> ErrorReply:
        while not isinstance(message := await connection.receive(), ErrorReply):
            pass
        return message

    return await asyncio.wait_for(wait(), 10)


async def test_a_commit_on_main_is_applied(
        hub: HubEmulator, served: tuple[CoordinatorServer, ProtocolConnection]) -> None:
    server, connection = served
    await connection.send(report(main_head(hub)))
    await wait_for(lambda: revision(server) == main_head(hub))
    assert server.stats.rejected_events == 0
    assert f"GET /api/models/{REPO}/revision/main" in hub.requests  # the Hub was asked


async def test_a_commit_only_on_a_pull_request_is_refused(
        hub: HubEmulator, served: tuple[CoordinatorServer, ProtocolConnection]) -> None:
    server, connection = served
    before = server.state.model.checkpoint
    pr = hub.commit(REPO, {"model.safetensors": b"poisoned"}, ref="refs/pr/1")
    await connection.send(report(pr))
    refused = await refusal(connection)
    assert refused.error == "CheckpointNotRunRepository"
    assert f"commit {pr} of Hub repository {REPO!r}" in refused.detail
    assert "not on its main branch" in refused.detail and "refs/pr/N" in refused.detail
    assert server.state.model.checkpoint == before


async def test_an_unknown_commit_is_refused(
        hub: HubEmulator, served: tuple[CoordinatorServer, ProtocolConnection]) -> None:
    server, connection = served
    before = server.state.model.checkpoint
    await connection.send(report("e" * 40))
    refused = await refusal(connection)
    assert refused.detail == (f"CheckpointNotRunRepository: Hub repository {REPO!r} at "
                              f"{hub.endpoint} has no commit {'e' * 40}")
    assert server.state.model.checkpoint == before


async def test_another_repository_is_refused_without_asking_the_hub(
        hub: HubEmulator, served: tuple[CoordinatorServer, ProtocolConnection]) -> None:
    connection = served[1]
    asked = len(hub.requests)
    await connection.send(report(main_head(hub), repo_id="someone/else"))
    refused = await refusal(connection)
    assert "the report names Hub repository 'someone/else'" in refused.detail
    assert len(hub.requests) == asked


async def test_an_unreachable_hub_refuses_in_one_line_and_the_server_goes_on(
        hub: HubEmulator, served: tuple[CoordinatorServer, ProtocolConnection]) -> None:
    server, connection = served
    before = server.state.model.checkpoint
    hub.stop()
    await connection.send(report(main_head(hub)))
    refused = await refusal(connection)
    assert refused.error == "CheckpointNotRunRepository" and "\n" not in refused.detail
    assert "did not answer" in refused.detail
    assert server.state.model.checkpoint == before
    # Still serving: another client joins, and the first one's next report is answered.
    other = await join(server, identity(2))
    await other.close()
    await connection.send(report("not-a-commit"))
    assert "not a commit id" in (await refusal(connection)).detail


async def test_without_the_check_a_report_is_applied_with_no_hub(hub: HubEmulator) -> None:
    hub.stop()  # no network at all: nothing to ask
    server = CoordinatorServer(Coordinator.from_state_file(make_state_file()),
                               server_options(checkpoint_history_check=False))
    assert server.report_checks is None
    async with server:
        connection = await join(server, identity(1))
        await wait_for(lambda: len(server.state.epoch_state.clients) == 1, timeout_s=10)
        await connection.send(report("a" * 40))
        await wait_for(lambda: revision(server) == "a" * 40)
        await connection.close()


def test_the_option_is_in_help() -> None:
    result = CliRunner().invoke(app, ["run", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "--no-checkpoint-history-check" in result.output
