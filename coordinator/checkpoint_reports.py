"""Whose word sets the run's checkpoint: the location is the authority's, the revision a
client's (docs/coordinator.md, "Checkpoint reports").

Psyche lets any client of the epoch point the run's checkpoint at any repository, the
last report winning, so one client could steer every later joiner to a model of its own.
Here the *location* (the Hub `repo_id`, or the GCS `bucket` and `prefix`) is the one the
run config's `checkpoint` names, set by the run's authority; the machine's own P2P<->Hub
and Gcs<->P2PGcs promotion and demotion keep it. A client's report may only advance the
*revision* within that repository, and the revision must be a commit id (40 lowercase hex
digits, what an upload to the repository's main branch returns): a branch, a tag or a ref
such as `refs/pr/1` (on the Hub anyone can open a pull request) names whatever its owner
points it at, not a state of the run's main history. Whether that commit is on main needs
the Hub (I/O, not this module): the uploader reports the commit its push to main made.
The machine, the on-chain program (`checkpoint` in
psyche_solana/programs/coordinator_machine.h) and the client (which warns instead of
sending a report that would be refused) all follow these functions.

    problem = report_problem(current, report)   # None: acceptable, and then
    updated = after_report(current, report)     # the run's new checkpoint
"""

from __future__ import annotations

import re

from coordinator.config_variants import (
    Checkpoint,
    GcsCheckpoint,
    HubCheckpoint,
    P2PCheckpoint,
    P2PGcsCheckpoint,
)

Report = HubCheckpoint | GcsCheckpoint
COMMIT_ID = re.compile(r"[0-9a-f]{40}")


def is_commit_id(revision: str | None) -> bool:
    """Whether `revision` is a full commit id (a Hub / git SHA-1), not a ref name."""
    return revision is not None and COMMIT_ID.fullmatch(revision) is not None


def describe_location(checkpoint: Checkpoint) -> str:
    """Where `checkpoint` points, without its revision or P2P/Hub tag (for messages)."""
    if isinstance(checkpoint, HubCheckpoint | P2PCheckpoint):
        return f"Hub repository {checkpoint.repo_id!r}"
    if isinstance(checkpoint, GcsCheckpoint | P2PGcsCheckpoint):
        prefix = "" if checkpoint.prefix is None else f" prefix {checkpoint.prefix!r}"
        return f"GCS bucket {checkpoint.bucket!r}{prefix}"
    return f"Dummy {checkpoint.repo_id!r} (no repository to report to)"


def location_problem(current: Checkpoint, report: Report) -> str | None:
    """Why `report` names another location than the run's `current` checkpoint (None: the
    same). A Hub report must name the repo_id of the current Hub or P2P checkpoint; a Gcs
    report the bucket and prefix of the current Gcs or P2PGcs one. A Hub report on a GCS
    run, a Gcs report on a Hub run, and any report on a Dummy run name another location.
    """
    if isinstance(report, HubCheckpoint):
        if isinstance(current, HubCheckpoint | P2PCheckpoint) and current.repo_id == report.repo_id:
            return None
    elif (isinstance(current, GcsCheckpoint | P2PGcsCheckpoint)
          and (current.bucket, current.prefix) == (report.bucket, report.prefix)):
        return None
    return (f"the report names {describe_location(report)}, the run's checkpoint is "
            f"{describe_location(current)} (set by the run's authority)")


def report_problem(current: Checkpoint, report: Report) -> str | None:
    """Why a client's `report` may not update the run's `current` checkpoint (None: it may):
    another location (`location_problem`), or a Hub revision that is not a commit id."""
    problem = location_problem(current, report)
    if problem is not None or not isinstance(report, HubCheckpoint):
        return problem
    if is_commit_id(report.revision):
        return None
    named = "no revision" if report.revision is None else f"revision {report.revision!r}"
    return (f"the report names {named} of {describe_location(report)}, not a commit id (40 "
            "lowercase hex digits): only the commit an upload to its main branch made ties "
            "the checkpoint to the run's history (a branch, tag or ref such as refs/pr/1 "
            "points wherever its owner sets it)")


def after_report(current: Checkpoint, report: Report) -> Checkpoint:
    """The run's checkpoint after an acceptable `report` (see `report_problem`): the new
    revision in the same repository, keeping the P2P tag. A Gcs location has no revision,
    so an acceptable Gcs report changes nothing."""
    if isinstance(report, HubCheckpoint) and isinstance(current, HubCheckpoint | P2PCheckpoint):
        return type(current)(repo_id=current.repo_id, revision=report.revision)
    return current


def _location_key(checkpoint: Checkpoint) -> tuple[str, str, str | None]:
    if isinstance(checkpoint, GcsCheckpoint | P2PGcsCheckpoint):
        return ("gcs", checkpoint.bucket, checkpoint.prefix)
    # A Dummy run becomes P2P (and then Hub) under the same repo_id: one location.
    return ("hub", checkpoint.repo_id, None)


def with_configured_location(current: Checkpoint, configured: Checkpoint) -> Checkpoint:
    """The checkpoint of a run whose authority now configures `configured` (a TCP server
    resumed with an edited state file): unchanged while the location is the same (the saved
    checkpoint carries the newest revision and the P2P tag); otherwise the configured one,
    kept P2P when the last epoch's clients hold the model (as `end_cooldown` would)."""
    if _location_key(current) == _location_key(configured):
        return current
    if isinstance(current, P2PCheckpoint | P2PGcsCheckpoint):
        if isinstance(configured, HubCheckpoint):
            return P2PCheckpoint(repo_id=configured.repo_id, revision=configured.revision)
        if isinstance(configured, GcsCheckpoint):
            return P2PGcsCheckpoint(bucket=configured.bucket, prefix=configured.prefix)
    return configured


__all__ = ["COMMIT_ID", "Report", "after_report", "describe_location", "is_commit_id",
           "location_problem", "report_problem", "with_configured_location"]
