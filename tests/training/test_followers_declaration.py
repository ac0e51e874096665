"""A trainer cannot choose the loose limits by what it declares (issue 36,
docs/verification.md "Declared replay settings"): a result without a declaration is
reported, an honest declared one is not, and one no follower can reproduce is judged
loosely, counted per trainer in the `result_verified` events. Real trainers, real
followers and the real verification duty; only the coordinator link records instead of
sending."""

from __future__ import annotations

import dataclasses

import torch
from follower_setup import (
    declaring_trainers,
    followers_on,
    replay_and_train,
    step_batches,
    tiny_model,
)

from client_image.runtime.events import ResultVerified, RuntimeEvent, VerificationReportSent
from client_image.runtime.observability import Counters, EventLog
from client_image.runtime.verifying import VerificationDuty
from client_image.verification.followers import UNDECLARED, Checked, Followers
from client_image.verification.settings import capture
from coordinator import NodeIdentity
from coordinator.state import VerificationReport

FOLLOWER = NodeIdentity(b"\x01" * 32)
HONEST, UNDECLARED_TRAINER, ELSEWHERE = b"\x0a" * 32, b"\x0b" * 32, b"\x0c" * 32


class FollowingWorker:
    """The worker port's verification calls, on real Followers in this thread."""

    def __init__(self, followers: Followers):
        self.followers = followers

    async def verify(self, trainer: bytes, step: int, published: bytes) -> Checked | None:
        return self.followers.verify(trainer, step, published)


class RecordingLink:
    def __init__(self) -> None:
        self.reports: list[VerificationReport] = []

    async def report_verification(self, report: VerificationReport) -> None:
        self.reports.append(report)


async def test_an_undeclared_result_is_reported_and_an_unreproducible_one_judged_loosely():
    own = capture("fp32", 2, "cpu")
    # ELSEWHERE declares a GPU: an honest trainer there, but this CPU follower cannot
    # reproduce it (the trainer below computes on the CPU, so its honest result still
    # passes the loose limits, which is the point: it passes, and is counted).
    on_gpu = dataclasses.replace(own, device="cuda", threads=0, hardware="Some GPU")
    trainers = {HONEST: own, UNDECLARED_TRAINER: None, ELSEWHERE: on_gpu}
    trained = declaring_trainers(trainers)
    follower_model = tiny_model()
    followers = followers_on(follower_model, own, known={HONEST: own, ELSEWHERE: on_gpu})
    followers.follow(list(trainers), start_step=0)
    events: list[RuntimeEvent] = []
    log = EventLog(mode="none")
    log.listeners.append(events.append)
    link = RecordingLink()
    duty = VerificationDuty(FOLLOWER, FollowingWorker(followers),  # type: ignore[arg-type]  # a stand-in worker
                            link, log, Counters())  # type: ignore[arg-type]  # a recording link
    duty.followed = list(trainers)
    for step, rows, tokens in step_batches(range(2)):
        results = [(key, replay_and_train(followers, key, trainer, step, tokens, rows))
                   for key, trainer in trained.items()]
        await duty.check(step, results)
        for trainer in trained.values():
            trainer.idle(step)

    verified = [e for e in events if isinstance(e, ResultVerified)]
    by_trainer = {key.hex(): [e for e in verified if e.trainer == key.hex()] for key in trainers}
    # The honest declared trainer: tight limits, exact, never reported, never loose.
    assert [(e.ok, e.replayed, e.judged_loosely, e.jaccard) for e in by_trainer[HONEST.hex()]
            ] == [(True, "declared", 0, 0.0)] * 2
    # No declaration: failed at every step with the reason naming it, reported once.
    assert [(e.ok, e.replayed, e.reason) for e in by_trainer[UNDECLARED_TRAINER.hex()]
            ] == [(False, "undeclared", UNDECLARED)] * 2
    # A declaration this follower cannot reproduce: passes the loose limits, and says so.
    elsewhere = by_trainer[ELSEWHERE.hex()]
    assert all(e.ok and e.replayed.startswith("cannot replay the declared settings: "
                                              "declared device cuda") for e in elsewhere)
    assert [e.judged_loosely for e in elsewhere] == [1, 2]
    assert [r.accused for r in link.reports] == [NodeIdentity(UNDECLARED_TRAINER)]
    sent = [e for e in events if isinstance(e, VerificationReportSent)]
    assert [(e.accused, e.reason) for e in sent] == [(UNDECLARED_TRAINER.hex(), UNDECLARED)]
    assert duty.counters.verification_reports_sent == 1
    assert torch.equal(next(follower_model.parameters()),
                       next(tiny_model().parameters()))
