"""`checkpoint(sender, index, repo)`: a client may only report a new revision of the run's
own repository, the one its authority configured (coordinator/checkpoint_reports.py);
and the authority can still move that repository.

Every refusal is checked to leave the serialized state byte-for-byte unchanged.
"""

from __future__ import annotations

import pytest
from coordinator_sim import node, state_file

from coordinator import Coordinator, CoordinatorError, Rejected, RunState, TickResult, encode_state
from coordinator.checkpoint_reports import report_problem, with_configured_location
from coordinator.config import (
    Checkpoint,
    DummyCheckpoint,
    GcsCheckpoint,
    HubCheckpoint,
    P2PCheckpoint,
    P2PGcsCheckpoint,
)

RUN = "org/run-model"
# Commit ids, as an upload to the repository's main branch returns them.
C1, C2 = "1" * 40, "c0ffee" + "2" * 34


def in_warmup(checkpoint: Checkpoint, **config: object) -> Coordinator:
    """A run in Warmup with clients node(0)..node(3) at indices 0..3 (the checkpoint is set
    after entering Warmup, which would demote a P2P one)."""
    coordinator = Coordinator.from_state_file(state_file(
        min_clients=2, init_min_clients=2, witness_nodes=2, warmup_time=10, **config))
    assert coordinator.tick([node(i) for i in range(4)], 100, 1) is TickResult.Ticked
    assert coordinator.state.run_state is RunState.Warmup
    coordinator.state.model = coordinator.state.model.model_copy(update={"checkpoint": checkpoint})
    return coordinator


def rejected(coordinator: Coordinator, call: object, error: CoordinatorError) -> Rejected:
    before = encode_state(coordinator.state)
    result = call() if callable(call) else call
    assert isinstance(result, Rejected) and result.error is error, result
    assert encode_state(coordinator.state) == before
    return result


@pytest.mark.parametrize(("current", "report", "expected"), [
    (HubCheckpoint(repo_id=RUN), HubCheckpoint(repo_id=RUN, revision=C2),
     HubCheckpoint(repo_id=RUN, revision=C2)),
    (P2PCheckpoint(repo_id=RUN, revision=C1), HubCheckpoint(repo_id=RUN, revision=C2),
     P2PCheckpoint(repo_id=RUN, revision=C2)),
    # a GCS location has no revision: an acceptable report changes nothing
    (GcsCheckpoint(bucket="b", prefix="p/"), GcsCheckpoint(bucket="b", prefix="p/"),
     GcsCheckpoint(bucket="b", prefix="p/")),
    (P2PGcsCheckpoint(bucket="b"), GcsCheckpoint(bucket="b"), P2PGcsCheckpoint(bucket="b")),
])
def test_a_new_revision_of_the_runs_repository_is_accepted(
        current: Checkpoint, report: HubCheckpoint | GcsCheckpoint, expected: Checkpoint) -> None:
    coordinator = in_warmup(current)
    assert coordinator.checkpoint(node(0), 0, report) is None
    assert coordinator.state.model.checkpoint == expected


@pytest.mark.parametrize(("current", "report"), [
    (HubCheckpoint(repo_id=RUN), HubCheckpoint(repo_id="someone/else", revision="r")),
    (P2PCheckpoint(repo_id=RUN, revision="r1"), HubCheckpoint(repo_id="someone/else")),
    (GcsCheckpoint(bucket="b", prefix="p/"), GcsCheckpoint(bucket="b")),
    (GcsCheckpoint(bucket="b", prefix="p/"), GcsCheckpoint(bucket="b", prefix="q/")),
    (P2PGcsCheckpoint(bucket="b", prefix="p/"), GcsCheckpoint(bucket="other", prefix="p/")),
    # the other kind of location (Psyche switched the run over)
    (P2PGcsCheckpoint(bucket="b"), HubCheckpoint(repo_id="b")),
    (P2PCheckpoint(repo_id=RUN), GcsCheckpoint(bucket=RUN)),
    (HubCheckpoint(repo_id=RUN), GcsCheckpoint(bucket="b")),
    # a Dummy run has no repository to report to (Psyche ignored these)
    (DummyCheckpoint(repo_id=RUN), HubCheckpoint(repo_id=RUN, revision="r")),
])
def test_a_foreign_repository_is_refused_and_changes_nothing(
        current: Checkpoint, report: HubCheckpoint | GcsCheckpoint) -> None:
    coordinator = in_warmup(current)
    refused = rejected(coordinator, lambda: coordinator.checkpoint(node(1), 1, report),
                       CoordinatorError.CheckpointNotRunRepository)
    assert coordinator.state.model.checkpoint == current
    assert str(refused).startswith("CheckpointNotRunRepository: the report names ")
    assert "set by the run's authority" in refused.detail


def test_the_other_checks_come_first() -> None:
    coordinator = Coordinator.from_state_file(state_file(run_state="Paused"))
    rejected(coordinator, lambda: coordinator.checkpoint(node(0), 0, HubCheckpoint(repo_id="x")),
             CoordinatorError.Halted)
    coordinator = in_warmup(HubCheckpoint(repo_id=RUN))
    foreign = HubCheckpoint(repo_id="x")
    rejected(coordinator, lambda: coordinator.checkpoint(node(0), 7, foreign),
             CoordinatorError.InvalidClientIndex)
    rejected(coordinator, lambda: coordinator.checkpoint(node(1), 0, foreign),
             CoordinatorError.NotYourIndex)
    rejected(coordinator, lambda: coordinator.checkpoint(node(0), 0, P2PCheckpoint(repo_id=RUN)),
             CoordinatorError.InvalidCheckpoint)
    rejected(coordinator, lambda: coordinator.checkpoint(node(9), 0, HubCheckpoint(repo_id=RUN)),
             CoordinatorError.NotYourIndex)


def test_reported_revision_survives_the_demotion_to_hub() -> None:
    """The next epoch without the last epoch's clients loads the reported revision."""
    coordinator = in_warmup(P2PCheckpoint(repo_id=RUN, revision=C1), total_steps=100)
    assert coordinator.checkpoint(node(2), 2, HubCheckpoint(repo_id=RUN, revision=C2)) is None
    assert coordinator.pause(101) is None  # Warmup: paused at once
    assert coordinator.resume(102) is None
    coordinator.tick([node(50), node(51)], 110, 1)
    assert coordinator.state.model.checkpoint == HubCheckpoint(repo_id=RUN, revision=C2)


@pytest.mark.parametrize(("saved", "configured", "expected"), [
    # same location: the saved checkpoint keeps its newer revision and its P2P tag
    (P2PCheckpoint(repo_id=RUN, revision="r9"), HubCheckpoint(repo_id=RUN),
     P2PCheckpoint(repo_id=RUN, revision="r9")),
    (HubCheckpoint(repo_id=RUN, revision="r9"), DummyCheckpoint(repo_id=RUN),
     HubCheckpoint(repo_id=RUN, revision="r9")),
    (P2PGcsCheckpoint(bucket="b", prefix="p/"), GcsCheckpoint(bucket="b", prefix="p/"),
     P2PGcsCheckpoint(bucket="b", prefix="p/")),
    # moved: the configured location, still P2P while the last epoch's clients hold the model
    (P2PCheckpoint(repo_id=RUN, revision="r9"), HubCheckpoint(repo_id="org/new"),
     P2PCheckpoint(repo_id="org/new")),
    (P2PCheckpoint(repo_id=RUN), GcsCheckpoint(bucket="b"), P2PGcsCheckpoint(bucket="b")),
    (HubCheckpoint(repo_id=RUN), HubCheckpoint(repo_id="org/new", revision="v"),
     HubCheckpoint(repo_id="org/new", revision="v")),
    (GcsCheckpoint(bucket="b", prefix="p/"), GcsCheckpoint(bucket="b", prefix="q/"),
     GcsCheckpoint(bucket="b", prefix="q/")),
])
def test_the_authoritys_configured_location_wins(saved: Checkpoint, configured: Checkpoint,
                                                 expected: Checkpoint) -> None:
    assert with_configured_location(saved, configured) == expected


def test_the_authority_moves_the_repository_of_a_halted_run() -> None:
    """Clients cannot move it; the authority's config update (here: the TCP server resumed
    with an edited state file, see coordinator_tcp/runner.py) can, and reports follow it."""
    coordinator = in_warmup(HubCheckpoint(repo_id=RUN), total_steps=100)
    new = HubCheckpoint(repo_id="org/new-home")
    rejected(coordinator, lambda: coordinator.checkpoint(node(0), 0, new),
             CoordinatorError.CheckpointNotRunRepository)
    assert coordinator.pause(101) is None
    state = coordinator.state
    state.model = state.model.model_copy(update={
        "checkpoint": with_configured_location(state.model.checkpoint, new)})
    assert coordinator.resume(102) is None
    coordinator.tick([node(i) for i in range(4)], 110, 1)
    assert state.run_state is RunState.Warmup
    assert coordinator.checkpoint(node(0), 0, HubCheckpoint(repo_id=new.repo_id,
                                                             revision=C1)) is None
    assert state.model.checkpoint == HubCheckpoint(repo_id=new.repo_id, revision=C1)
    rejected(coordinator, lambda: coordinator.checkpoint(node(0), 0, HubCheckpoint(repo_id=RUN)),
             CoordinatorError.CheckpointNotRunRepository)


def test_report_problem_names_both_locations() -> None:
    problem = report_problem(GcsCheckpoint(bucket="b", prefix="p/"), HubCheckpoint(repo_id="me/x"))
    assert problem == ("the report names Hub repository 'me/x', the run's checkpoint is "
                       "GCS bucket 'b' prefix 'p/' (set by the run's authority)")
    assert report_problem(HubCheckpoint(repo_id="me/x"),
                          HubCheckpoint(repo_id="me/x", revision=C1)) is None


@pytest.mark.parametrize("revision", [
    "refs/pr/1", "main", "refs/heads/main", "v1.0", None, "", C1[:7], C1 + "0", C2.upper(),
    C1[:39] + "g", " " + C1[1:], "refs/pr/" + C1[8:]])
@pytest.mark.parametrize("current", [HubCheckpoint(repo_id=RUN),
                                     P2PCheckpoint(repo_id=RUN, revision=C1)])
def test_a_revision_that_is_not_a_commit_id_is_refused_with_the_reason(
        current: Checkpoint, revision: str | None) -> None:
    """Anyone can open a pull request on the Hub: a report pointing the run at refs/pr/1
    (or a branch, a tag, an abbreviated id) would steer every later joiner to a model of
    its choosing. Only a full commit id, the one an upload to main returns, is taken."""
    coordinator = in_warmup(current)
    refused = rejected(coordinator, lambda: coordinator.checkpoint(
        node(1), 1, HubCheckpoint(repo_id=RUN, revision=revision)),
        CoordinatorError.CheckpointNotRunRepository)
    named = "no revision" if revision is None else f"revision {revision!r}"
    assert refused.detail.startswith(f"the report names {named} of Hub repository '{RUN}', "
                                     "not a commit id"), refused.detail
    assert coordinator.state.model.checkpoint == current
