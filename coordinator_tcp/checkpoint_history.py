"""Whether a reported checkpoint commit is on the main history of the run's Hub repository
(docs/coordinator.md, "Checkpoint reports").

The pure coordinator (coordinator/checkpoint_reports.py) already refuses a report naming
another repository, another GCS bucket or prefix, or a Hub revision that is not a commit
id. What it cannot know without the network is whether that commit is on the repository's
main branch: on the Hub anyone may open a pull request, whose commits (reachable only from
`refs/pr/N`) hold whatever its author uploaded. The TCP server asks a `CheckpointHistory`
before it applies a Hub report; a commit that is not on main, or a Hub that does not
answer, is refused with the reason, and nothing is applied. A GCS location has no commits:
the run's bucket and prefix are its history, and the pure check already ties a report to
them, so a GCS report needs no network here.

    history = HubHistory()                       # HF_ENDPOINT, or endpoint=...
    problem = await history.on_main("org/model", commit)  # None: on main; else why not
    checks = ReportChecks(history)               # what the server uses, one task per report
    checks.start(state, sender, message, then)   # then(Rejected | None) once decided
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

from coordinator import CoordinatorError, CoordinatorState, NodeIdentity, Rejected
from coordinator.checkpoint_reports import describe_location, report_problem
from coordinator.config_variants import HubCheckpoint
from coordinator.messages import CheckpointReport
from psyche_common.hub_history import MainHistoryAnswer, ask_main_history, one_line

__all__ = ["CheckpointHistory", "HubHistory", "ReportChecks"]

T = TypeVar("T")


class CheckpointHistory(Protocol):
    async def on_main(self, repo_id: str, commit: str) -> str | None:
        """None when `commit` is on the main branch of Hub repository `repo_id`; else, in
        one line, why the report naming it is refused (not on main, no such commit, the
        Hub not answering). Never raises for what the Hub answers or fails to."""
        ...


def in_daemon_thread(work: Callable[[], T]) -> asyncio.Future[T]:
    """`work()` in a daemon thread of its own, as a future of the running loop. Not the
    loop's default executor: huggingface_hub's session has no timeout and retries network
    errors for about 20 s, and a thread still waiting there must neither delay the
    process's exit nor the closing of the loop (which joins the default executor)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # timed out or cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(cast(T, result))  # T whenever no error was raised

    def target() -> None:
        try:
            result, error = work(), None
        except BaseException as exc:  # handed to the awaiting task, raised there
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, daemon=True, name="checkpoint-history").start()
    return future


class HubHistory:
    """`CheckpointHistory` from the Hub through huggingface_hub
    (psyche_common.hub_history: main's head, else main's listing, else whether the
    repository has the commit at all). Each question runs in a thread under `timeout_s`; at most `max_running` such threads at once (a report beyond
    that is refused as busy, so a flood of reports cannot pile up threads). Main's commits
    are remembered per repository (main only grows: one listing serves every later report
    of them); an answer that refuses is remembered `refused_ttl_s`, so a client repeating
    a bad report does not make the server ask the Hub each time."""

    def __init__(self, endpoint: str | None = None, *, timeout_s: float = 10.0,
                 max_running: int = 8, refused_ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoint = endpoint  # None: huggingface_hub's (HF_ENDPOINT)
        self.timeout_s = timeout_s
        self.max_running = max_running
        self.refused_ttl_s = refused_ttl_s
        self.clock = clock
        self.main_commits: dict[str, set[str]] = {}
        self.refused: dict[tuple[str, str], tuple[float, str]] = {}
        self.running = 0  # threads still asking the Hub (timed-out ones included)
        self.lock = threading.Lock()

    def where(self) -> str:
        if self.endpoint is not None:
            return self.endpoint
        from huggingface_hub import constants

        return constants.ENDPOINT

    async def on_main(self, repo_id: str, commit: str) -> str | None:
        if commit in self.main_commits.get(repo_id, ()):
            return None
        key = (repo_id, commit)
        remembered = self.refused.get(key)
        if remembered is not None and self.clock() - remembered[0] < self.refused_ttl_s:
            return remembered[1]
        with self.lock:
            if self.running >= self.max_running:
                return (f"cannot check commit {commit} against the main branch of Hub "
                        f"repository {repo_id!r} now ({self.running} checks still waiting "
                        f"for the Hub at {self.where()}): report again later")
            self.running += 1
        try:
            answer = await asyncio.wait_for(
                in_daemon_thread(lambda: self.ask(repo_id, commit)), self.timeout_s)
        except TimeoutError:
            return (f"cannot check commit {commit} against the main branch of Hub "
                    f"repository {repo_id!r}: the Hub at {self.where()} did not answer "
                    f"within {self.timeout_s:g} s")
        self.main_commits.setdefault(repo_id, set()).update(answer.main)
        if answer.problem is not None and answer.reached:  # unreachable: ask again next time
            if len(self.refused) >= 1024:
                self.refused.clear()
            self.refused[key] = (self.clock(), answer.problem)
        return answer.problem

    def ask(self, repo_id: str, commit: str) -> MainHistoryAnswer:
        """Blocking, in a thread."""
        try:
            return ask_main_history(repo_id, commit, endpoint=self.endpoint,
                                    timeout_s=self.timeout_s)
        finally:
            with self.lock:
                self.running -= 1


class ReportChecks:
    """The checkpoint reports the TCP server is checking against the Hub, one task each.

    `start` decides at once, without the network, what the coordinator refuses anyway (no
    location, a GCS report, a sender not at its index, another repository, a revision that
    is not a commit id): `then(None)` at once, and the coordinator answers it. A Hub report
    it would accept is checked by the history; `then` gets the refusal, or None to apply
    it. `then` runs on the event loop, after the check, never with an exception from it."""

    def __init__(self, history: CheckpointHistory) -> None:
        self.history = history
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self, state: CoordinatorState, sender: NodeIdentity, message: CheckpointReport,
              then: Callable[[Rejected | None], None]) -> None:
        report = message.repo if isinstance(message.repo, HubCheckpoint) else None
        clients = state.epoch_state.clients
        if (report is None or message.index >= len(clients)
                or clients[message.index].id != sender
                or report_problem(state.model.checkpoint, report) is not None):
            then(None)
            return
        task = asyncio.create_task(self.check(report, then), name="checkpoint-history")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def check(self, report: HubCheckpoint,
                    then: Callable[[Rejected | None], None]) -> None:
        assert report.revision is not None  # report_problem refused it otherwise
        try:
            problem = await self.history.on_main(report.repo_id, report.revision)
        except Exception as exc:  # a history that breaks its promise must not stop the run
            problem = (f"checking {describe_location(report)} commit {report.revision} "
                       f"failed: {one_line(exc)}")
        then(None if problem is None
             else Rejected(CoordinatorError.CheckpointNotRunRepository, problem))

    async def close(self) -> None:
        """Cancel the checks in flight (a stopping server answers none of them)."""
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
