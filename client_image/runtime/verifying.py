"""The client's verification duty when the run sets `verification_percent` > 0
(docs/verification.md; who follows whom: coordinator/verification.py).

    warm-up            reset_delta: every trainer starts the epoch from a zero delta, so
                       its followers can replay it from there
    round 0            follow the trainers the epoch's plan gives this client
    every round        after apply, before training: replay each followed trainer's batch
    apply of step s    compare each followed trainer's consensus result with the replay;
                       a mismatch is a signed report to the coordinator (once per trainer
                       and epoch); two followers' reports eject the trainer
    any apply          results of trainers already ejected (moved to exited_clients with
                       state Ejected, which happens only at a round's start, so every
                       client sees it at the same step) are left out everywhere

A replay verdict is one follower's opinion, so it never leaves a result out by itself: only
the coordinator's quorum does.
"""

from __future__ import annotations

from collections.abc import Sequence

from client_image.data import fetch_training_batch
from client_image.runtime.events import Ejected, Following, ResultVerified, VerificationReportSent
from client_image.runtime.observability import Counters, EventLog
from client_image.runtime.ports import CoordinatorLink, DataSource, Worker
from client_image.runtime.rounds import StepRecord
from coordinator import ClientState, CoordinatorState, NodeIdentity
from coordinator.state import EpochState, VerificationReport
from coordinator.verification import epoch_replay_classes, plan_for_epoch, reporters_of, to_ppm


def verification_on(state: CoordinatorState) -> bool:
    return state.config.verification_percent > 0


def same_class_trainers(epoch: EpochState, me: NodeIdentity,
                        followed: Sequence[bytes]) -> dict[bytes, int]:
    """Of `followed`, the trainers of this client's nonzero replay class in the state, with
    it: their results must declare settings of that class (verification/followers.py)."""
    classes = epoch_replay_classes(epoch)
    mine = classes.get(me, 0)
    return {key: mine for key in followed if mine != 0 and classes.get(NodeIdentity(key)) == mine}


def ejected_trainers(state: CoordinatorState) -> set[bytes]:
    """Trainers whose results no client applies any more (see the module docstring)."""
    return {c.id.key for c in state.epoch_state.exited_clients if c.state is ClientState.Ejected}


class VerificationDuty:
    def __init__(self, me: NodeIdentity, worker: Worker, backend: CoordinatorLink,
                 events: EventLog, counters: Counters):
        self.me = me
        self.worker = worker
        self.backend = backend
        self.events = events
        self.counters = counters
        self.followed: list[bytes] = []
        self.reported: set[bytes] = set()
        self.told_ejected_epoch = -1

    async def start_epoch(self, state: CoordinatorState) -> None:
        self.followed, self.reported = [], set()
        if verification_on(state):
            await self.worker.reset_delta()

    async def begin_round(self, state: CoordinatorState) -> None:
        if not verification_on(state) or state.current_round.height != 0:
            return
        plan = plan_for_epoch(state.epoch_state, state.config.verification_percent)
        followed = [trainer.key for trainer in plan.followed_by(self.me)]
        able = await self.worker.follow(followed, state.progress.step,
                                        same_class_trainers(state.epoch_state, self.me,
                                                            followed))
        self.followed = followed if able else []
        self.events.emit(Following(epoch=state.progress.epoch,
                                   trainers=tuple(key.hex() for key in followed), able=able))

    async def replay(self, state: CoordinatorState, record: StepRecord,
                     data: DataSource) -> None:
        cold_start = record.height == 0 and state.epoch_state.cold_start_epoch
        for trainer in self.followed:
            batch = record.batch_of(trainer)
            if batch is None:
                continue  # not training this step: its delta does not move either
            tokens = await fetch_training_batch(data, batch[0], batch[1],
                                                state.model.data_type)
            await self.worker.replay(trainer, record.step, tokens, batch, cold_start)

    async def check(self, of_step: int, results: Sequence[tuple[bytes, bytes]]) -> None:
        """Verify the followed trainers' consensus results of `of_step`."""
        for sender, payload in results:
            if sender not in self.followed:
                continue
            checked = await self.worker.verify(sender, of_step, payload)
            if checked is None:
                continue
            verdict, distances = checked.verdict, checked.verdict.distances
            self.events.emit(ResultVerified(
                of_step=of_step, trainer=sender.hex(), ok=verdict.ok,
                jaccard=round(distances.jaccard, 6), hamming=round(distances.hamming, 6),
                manhattan=round(distances.manhattan, 6), reason=verdict.reason,
                replayed=checked.replayed, judged_loosely=checked.judged_loosely))
            if verdict.ok:
                self.counters.verifications_passed += 1
                continue
            self.counters.verifications_failed += 1
            if sender in self.reported:
                continue
            self.reported.add(sender)
            await self.backend.report_verification(VerificationReport(
                reporter=self.me, accused=NodeIdentity(sender), step=of_step, published_hash=checked.published_hash,
                expected_hash=checked.expected_hash, jaccard_ppm=to_ppm(distances.jaccard),
                hamming_ppm=to_ppm(distances.hamming),
                manhattan_ppm=to_ppm(distances.manhattan)))
            self.counters.verification_reports_sent += 1
            self.events.emit(VerificationReportSent(of_step=of_step, accused=sender.hex(),
                                                    reason=verdict.reason))

    def notice(self, state: CoordinatorState) -> None:
        """Tell this client's log (and TUI) once per epoch that it was ejected, and by whom."""
        epoch = state.epoch_state
        mine = [c for c in (*epoch.clients, *epoch.exited_clients) if c.id == self.me]
        if (mine and mine[0].state is ClientState.Ejected
                and self.told_ejected_epoch != state.progress.epoch):
            self.told_ejected_epoch = state.progress.epoch
            reporters = sorted(key.key.hex() for key in reporters_of(epoch, self.me))
            self.events.emit(Ejected(epoch=state.progress.epoch, reporters=tuple(reporters)))
