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
    F        = min(2, m - 1)

Followers are grouped by replay class (a u16 each client joins with, 0 = none; issue 36):
a follower judges a trainer with tight limits only when its machine can reproduce the
trainer's, which the class stands for. For the watched trainer t of class c:

    G        = the members of class c when c != 0, sorted by key      (g of them)
    F_c      = min(F, g - 1) when c != 0, else 0
    pos_c(x) = swap_or_not(rank of x in G, g, SHA-256(SHA-256(seed_u64_le) || "verify" || c_u16_le))
    y follows t  iff  y in G and (pos_c(y) - pos_c(t)) mod g in 1..F_c      (same class)
                  or  (pos(y) - pos(t)) mod m in 1..F - F_c                 (global)

A follower that is both counts once (t may then have fewer than F). With every class 0
this is followers(order[p]) = order[p+1 .. p+F] (mod m), the plan before classes existed.

Who may be listed (eligible_joiners, class_shortfalls): with verification on, a warm-up
lists only the pending joiners of class 0 or of a class that
min(FOLLOWERS_PER_TRAINER + 1, pending joiners) of them share, so each listed trainer of a
nonzero class starts the epoch with F followers of its own class; the others stay pending.

A report names a trainer, a step and the evidence (the published result's hash, the
follower's expected result's hash, the three distances). It counts only from one of the
trainer's followers, once per follower. A trainer is ejected when REPORT_QUORUM distinct
followers report it: one dishonest follower cannot eject anyone, two must both be elected
followers of the same client by the round seed. With two clients (F = 1) reports are
recorded as evidence but never eject.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coordinator.committee import election_order
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


def class_salt(replay_class: int) -> bytes:
    """The election salt of one replay class's own order (u16, little-endian)."""
    return VERIFY_SALT + replay_class.to_bytes(2, "little")


def follow_plan(members: list[NodeIdentity], seed: int, verification_percent: int,
                replay_classes: Mapping[NodeIdentity, int] | None = None) -> FollowPlan:
    """`members` sorted by key; `replay_classes`: each member's class (absent: 0)."""
    m = len(members)
    if verification_percent <= 0 or m < 2:
        return FollowPlan({})
    order = election_order(members, seed, VERIFY_SALT)
    watched = min(m, (m * verification_percent + 99) // 100)
    per_trainer = min(FOLLOWERS_PER_TRAINER, m - 1)
    classes = replay_classes or {}
    groups: dict[int, list[NodeIdentity]] = {}
    for member in members:
        replay_class = classes.get(member, 0)
        if replay_class != 0:
            groups.setdefault(replay_class, []).append(member)
    orders = {c: election_order(group, seed, class_salt(c))
              for c, group in groups.items() if len(group) > 1}
    followers: dict[NodeIdentity, tuple[NodeIdentity, ...]] = {}
    for p in range(watched):
        trainer = order[p]
        same: list[NodeIdentity] = []
        class_members = orders.get(classes.get(trainer, 0))
        if class_members is not None:
            g = len(class_members)
            at = class_members.index(trainer)
            same = [class_members[(at + k) % g] for k in range(1, min(per_trainer, g - 1) + 1)]
        global_ = [order[(p + k) % m] for k in range(1, per_trainer - len(same) + 1)]
        followers[trainer] = tuple(same + [y for y in global_ if y not in same])
    return FollowPlan(followers)


def epoch_replay_classes(epoch: EpochState) -> dict[NodeIdentity, int]:
    """Each of the epoch's clients' replay class, listed or exited."""
    return {client.id: client.replay_class
            for client in (*epoch.exited_clients, *epoch.clients)}


def plan_for_epoch(epoch: EpochState, verification_percent: int) -> FollowPlan:
    """The plan once the epoch's first round started (its seed is set then)."""
    return follow_plan(epoch_members(epoch), epoch.verification_seed, verification_percent,
                       epoch_replay_classes(epoch))


def class_shortfalls(pending: Sequence[NodeIdentity], replay_classes: Mapping[NodeIdentity, int],
                     verification_percent: int) -> dict[NodeIdentity, int]:
    """The pending joiners that are not *eligible* for a verified epoch, each with how many
    more pending joiners of its replay class it waits for (issue 36). The rule, which the
    on-chain program mirrors (pending = registry entries with active == next_active, in
    registry order; O(n^2) class counting):

        if verification_percent == 0: every joiner is eligible (nothing changes)
        n     = len(pending)        distinct joiners, after dedupe, before MAX_CLIENTS
        need  = min(FOLLOWERS_PER_TRAINER + 1, n)                       (3 when n >= 3)
        count(c) = how many of `pending` have class c (absent from replay_classes: 0)
        x is eligible  iff  class(x) == 0  or  count(class(x)) >= need
        shortfall(x) = need - count(class(x))   for each x not eligible  (always >= 1)

    A warm-up lists the first MAX_CLIENTS eligible joiners in pending order. So every
    listed trainer of a nonzero class has all its F = min(2, listed - 1) followers in its
    own class, who replay it in its declared settings with the tight limits: a client
    cannot buy the loose limits by declaring a class nobody else has. Class 0 declares
    nothing (its watched results fail as undeclared anyway): always eligible. A class cut
    short by the MAX_CLIENTS cap or by exits during the epoch gets global followers for
    the rest (follow_plan)."""
    if verification_percent == 0:
        return {}
    if len(set(pending)) != len(pending):
        raise ValueError("pending joiners must be distinct (dedupe them first)")
    need = min(FOLLOWERS_PER_TRAINER + 1, len(pending))
    counts = Counter(replay_classes.get(node, 0) for node in pending)
    shortfalls = {}
    for node in pending:
        replay_class = replay_classes.get(node, 0)
        if replay_class != 0 and counts[replay_class] < need:
            shortfalls[node] = need - counts[replay_class]
    return shortfalls


def eligible_joiners(pending: Sequence[NodeIdentity], replay_classes: Mapping[NodeIdentity, int],
                     verification_percent: int) -> list[NodeIdentity]:
    """The pending joiners a warm-up may list and count, in pending order: all of them
    with verification off, else those of class 0 or of a class at least
    min(FOLLOWERS_PER_TRAINER + 1, len(pending)) pending joiners share (class_shortfalls
    states the rule). The others stay pending."""
    short = class_shortfalls(pending, replay_classes, verification_percent)
    return [node for node in pending if node not in short]


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
