"""Step s-2's consensus results applied, and the witnesses' health checks of its trainers
(docs/coordinator.md, "Consensus for apply"): the part of a round that acts on what the
previous rounds' witnesses vouched for.

    applier = ConsensusApplier(me, worker, backend, verifying, events, counters)
    await applier.apply(state, step, record)     record: step s-2's StepRecord; raises
                                                 MissingResults (the runner desyncs)
    await applier.health_check(state, judged)    an elected witness reports round h-2's
                                                 trainers the witnesses missed
    applier.previous_results                     sender -> its last consensus result (the
                                                 `repeat` check's previous); reset per epoch
"""

from __future__ import annotations

import asyncio
import time

from client_image.runtime.events import Applied, HealthCheckSent, ResultLeftOut
from client_image.runtime.observability import Counters, EventLog
from client_image.runtime.ports import CoordinatorLink, Worker
from client_image.runtime.rounds import StepRecord, consensus_winners, unhealthy_trainers
from client_image.runtime.verifying import VerificationDuty, ejected_trainers
from coordinator import CoordinatorState, NodeIdentity
from coordinator.messages import HealthCheck


class MissingResults(RuntimeError):
    """Consensus results that could not be downloaded before the deadline."""


class ConsensusApplier:
    def __init__(self, me: NodeIdentity, worker: Worker, backend: CoordinatorLink,
                 verifying: VerificationDuty, events: EventLog, counters: Counters):
        self.me = me
        self.worker = worker
        self.backend = backend
        self.verifying = verifying
        self.events = events
        self.counters = counters
        self.previous_results: dict[bytes, bytes] = {}

    async def apply(self, state: CoordinatorState, step: int, record: StepRecord,
                    download_timeout_s: float) -> None:
        """Apply step `step - 2`'s consensus results (those `state.previous_round`'s
        witnesses vouched for), waiting up to `download_timeout_s` for downloads still in
        flight; MissingResults names the batches whose results never came."""
        vouching = state.previous_round
        assert vouching is not None, "the runner applies only from height 2 on"
        winners = consensus_winners(record, vouching)
        deadline = time.monotonic() + download_timeout_s
        while any(c not in record.payloads for c in winners.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # downloads in flight finish; failures leave them missing
        missing = [batch for batch, c in winners.items() if c not in record.payloads]
        if missing:
            raise MissingResults(f"step {step - 2}: consensus results {missing} not "
                                 "downloadable")
        batches = sorted(winners)
        payloads = [record.payloads[winners[batch]] for batch in batches]
        senders = [record.announced[batch][winners[batch]].sender for batch in batches]
        results = list(zip(senders, payloads, strict=True))
        # Every client screens the same consensus results against the same previous ones,
        # so all leave out the same: the weights stay identical (verification/checks.py).
        # Ejected trainers' results are left out first (runtime/verifying.py).
        ejected = ejected_trainers(state)
        screened = [i for i, sender in enumerate(senders) if sender not in ejected]
        checked = await self.worker.screen(step - 2, [results[i] for i in screened],
                                           self.previous_results)
        left_out = {screened[i]: why for i, why in checked.items()}
        left_out.update({i: ("ejected", "its followers reported it to the coordinator")
                         for i, sender in enumerate(senders) if sender in ejected})
        self.previous_results = dict(results)
        await self.verifying.check(step - 2, [r for r in results if r[0] not in ejected])
        for position, (check, detail) in sorted(left_out.items()):
            self.events.emit(ResultLeftOut(of_step=step - 2, trainer=senders[position].hex(),
                                           check=check, detail=detail))
        kept = [payload for i, payload in enumerate(payloads) if i not in left_out]
        applied = await self.worker.apply(step, kept) if kept else 0
        self.counters.apply_message_success += applied
        self.counters.last_result_sizes = [len(p) for p in payloads]
        self.events.emit(Applied(step=step, of_step=step - 2, results=applied,
                                 skipped=len(record.assignments) - len(winners),
                                 left_out=len(left_out)))

    async def health_check(self, state: CoordinatorState, judged: StepRecord) -> None:
        """Report the trainers of `judged` (round h-2) whose results the previous round's
        witnesses did not confirm."""
        expected = {node.key for node in judged.assignments.values()}
        # Never ourselves: the check is for peers whose results the witnesses missed. A
        # client reporting itself gets dropped, and when it is the last holder of the
        # model (a chaos run's spared client did this) the next epoch falls back to the
        # stored checkpoint; if we really failed, our peers report it.
        checks = [(node, proof) for node, proof in unhealthy_trainers(state, expected)
                  if node != self.me]
        if not checks:
            return
        await self.backend.send_health_check(HealthCheck(checks=tuple(checks)))
        self.events.emit(HealthCheckSent(step=state.progress.step,
                                         unhealthy=tuple(node.key.hex()[:12] for node, _ in checks)))


__all__ = ["ConsensusApplier", "MissingResults"]
