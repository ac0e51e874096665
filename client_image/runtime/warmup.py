"""Warm-up witnessing: who has loaded the model this epoch, and our warm-up witness.

Every client gossips Finished{warmup} once its model and data are ready. When every
healthy client of the epoch has, the first W of them (W = the round's witness count)
each send one warm-up witness, which lets the coordinator start the first round before
`warmup_time` runs out.
"""

from __future__ import annotations

from client_image.runtime.events import WarmupWitnessSent
from client_image.runtime.observability import Counters, EventLog
from client_image.runtime.ports import CoordinatorLink
from client_image.runtime.rounds import make_witness
from coordinator import ClientState, CoordinatorState, NodeIdentity, RunState
from coordinator.messages import WarmupWitness


class WarmupTracker:
    def __init__(self, me: NodeIdentity, backend: CoordinatorLink, events: EventLog,
                 counters: Counters):
        self.me = me
        self.backend = backend
        self.events = events
        self.counters = counters
        self.epoch: int | None = None
        self.ready: set[bytes] = set()  # clients that gossiped Finished{warmup} this epoch
        self.witnessed_epoch: int | None = None  # the epoch our warm-up witness went for

    def begin(self, epoch: int) -> bool:
        """A Warmup state of `epoch`; True the first time (start warming up then)."""
        if self.epoch == epoch:
            return False
        self.epoch, self.ready = epoch, set()
        return True

    def heard(self, sender: bytes) -> None:
        self.ready.add(sender)

    async def maybe_witness(self, state: CoordinatorState | None, model_fresh: bool) -> None:
        """Once every listed client has loaded, the first W clients report warm-up done."""
        if state is None or state.run_state is not RunState.Warmup or not model_fresh:
            return
        index = state.index_of(self.me)
        if index is None or index >= state.config.witness_count(len(state.epoch_state.clients)):
            return
        everyone = {c.id.key for c in state.epoch_state.clients if c.state is ClientState.Healthy}
        if not everyone <= self.ready or self.epoch is None or self.witnessed_epoch == self.epoch:
            return
        self.witnessed_epoch = self.epoch
        witness = make_witness(None, index, index, False)
        await self.backend.send_warmup_witness(WarmupWitness(witness=witness))
        self.counters.witnesses_sent += 1
        self.events.emit(WarmupWitnessSent(epoch=state.progress.epoch))
