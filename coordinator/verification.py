"""Who verifies whom in an epoch, and what a verification report must satisfy
(docs/verification.md, "Followers, reports and ejection").

A DisTrO result can be recomputed only by following its trainer from a point where its
delta is zero (the epoch's start, when verification is on): a *follower* keeps a shadow of
the trainer's optimizer and replays each of its batches. The plan is a pure function of
the epoch, so every client and the coordinator derive the same one:

    members  = the epoch's clients, listed and exited, sorted by key         (m of them)
    pos(i)   = swap_or_not(i, m, SHA-256(SHA-256(seed_u64_le) || "verify"))  seed: round 0's
    order    = members sorted by pos
    watched  = order[p] for p < ceil(m * verification_percent / 100)
    followers(order[p]) = order[p+1 .. p+F] (mod m),   F = min(2, m - 1)

A report names a trainer, a step and the evidence (the published result's hash, the
follower's expected result's hash, the three distances). It counts only from one of the
trainer's followers, once per follower. A trainer is ejected when REPORT_QUORUM distinct
followers report it: one dishonest follower cannot eject anyone, two must both be elected
followers of the same client by the round seed. With two clients (F = 1) reports are
recorded as evidence but never eject.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.committee import election_table
from coordinator.state import EpochState, NodeIdentity, VerificationReport

VERIFY_SALT = b"verify"
FOLLOWERS_PER_TRAINER = 2
REPORT_QUORUM = 2
MAX_REPORTS = 32  # epoch_state.reports capacity (on-chain fixed array)
PPM = 1_000_000  # distances travel as parts per million, u32
U32_MAX = 2**32 - 1


def epoch_members(epoch: EpochState) -> list[NodeIdentity]:
    """The epoch's clients, listed or exited, sorted by key (order-independent)."""
    return sorted({client.id for client in (*epoch.clients, *epoch.exited_clients)})


@dataclass(frozen=True)
class FollowPlan:
    """trainer -> its followers for one epoch (see the module docstring)."""

    followers: dict[NodeIdentity, tuple[NodeIdentity, ...]]

    def followed_by(self, follower: NodeIdentity) -> list[NodeIdentity]:
        return sorted(t for t, fs in self.followers.items() if follower in fs)

    def follows(self, follower: NodeIdentity, trainer: NodeIdentity) -> bool:
        return follower in self.followers.get(trainer, ())


def follow_plan(members: list[NodeIdentity], seed: int, verification_percent: int) -> FollowPlan:
    m = len(members)
    if verification_percent <= 0 or m < 2:
        return FollowPlan({})
    table = election_table(seed, m, VERIFY_SALT)
    order = [member for _, member in sorted(zip(table, members, strict=True))]
    watched = min(m, (m * verification_percent + 99) // 100)
    per_trainer = min(FOLLOWERS_PER_TRAINER, m - 1)
    return FollowPlan({order[p]: tuple(order[(p + k) % m] for k in range(1, per_trainer + 1))
                       for p in range(watched)})


def plan_for_epoch(epoch: EpochState, verification_percent: int) -> FollowPlan:
    """The plan once the epoch's first round started (its seed is set then)."""
    return follow_plan(epoch_members(epoch), epoch.verification_seed, verification_percent)


def report_problem(epoch: EpochState, plan: FollowPlan, report: VerificationReport,
                   current_step: int) -> str | None:
    """Why `report` cannot be recorded, or None."""
    if not plan.follows(report.reporter, report.accused):
        return f"{report.reporter!r} does not follow {report.accused!r} this epoch"
    if not epoch.start_step <= report.step < current_step:
        return f"step {report.step} is not a trained step of this epoch"
    if len(report.published_hash) != 32 or len(report.expected_hash) != 32:
        return "result hashes must be 32 bytes"
    if report.published_hash == report.expected_hash:
        return "the published and expected results are the same"
    for name in ("jaccard_ppm", "hamming_ppm", "manhattan_ppm"):
        if not 0 <= getattr(report, name) <= U32_MAX:
            return f"{name} must be a u32"
    if any(r.reporter == report.reporter and r.accused == report.accused for r in epoch.reports):
        return "this follower already reported this trainer in this epoch"
    if len(epoch.reports) >= MAX_REPORTS:
        return f"the epoch already holds {MAX_REPORTS} reports"
    return None


def reporters_of(epoch: EpochState, accused: NodeIdentity) -> set[NodeIdentity]:
    return {r.reporter for r in epoch.reports if r.accused == accused}


def to_ppm(distance: float) -> int:
    return max(0, min(U32_MAX, round(distance * PPM)))
