"""One client's rounds: what it does in each coordinator phase, and all the state of it.

    WaitingForMembers / Warmup   load the model (peers of the last epoch, or the Hub),
                                 open the data, gossip Finished{warmup}; once every listed
                                 client has, the first W clients send the warm-up witness
    RoundTrain (step s, height h) an elected witness health-checks round h-2's trainers
                                 (h >= 2); apply the consensus results of step s-2
                                 (h >= 2); train the assigned batch; publish the result
                                 and announce it; download everyone's results; gossip
                                 Finished{s} once our own work and all of step s-1 are in;
                                 an elected witness submits as soon as every client has
                                 finished (opportunistic witnessing)
    RoundWitness                 an elected witness that has not submitted does so now
    Cooldown                     checkpoint; share the model with the next joiners

Anything the runner cannot follow (missed rounds, a consensus payload it cannot get) is a
desync: it stops training and rejoins cleanly at the next epoch. The per-step records and
the consensus rules are in rounds.py; everything outside (coordinator, peers, model, data)
is reached through the ports in ports.py, so tests drive the runner with fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from client_image.data import DataProviderError, DataServerMismatch
from client_image.p2p import Finished, ResultAnnouncement
from client_image.p2p.messages import BatchId as WireBatchId
from client_image.runtime.consensus_apply import ConsensusApplier, MissingResults
from client_image.runtime.events import (
    Desynced,
    Ready,
    TaskFailed,
    Trained,
    WitnessSent,
)
from client_image.runtime.model_keeper import CheckpointOptions, ModelKeeper
from client_image.runtime.observability import Counters, EventLog
from client_image.runtime.ports import (
    Broadcast,
    CoordinatorLink,
    DataOpener,
    DataSource,
    IdleWork,
    Peers,
    PhaseTracer,
    Unrunnable,
    Worker,
)
from client_image.runtime.prefetch import BatchPrefetch, batch_fetch
from client_image.runtime.result_downloads import ResultDownloads
from client_image.runtime.rounds import (
    BatchKey,
    StepRecord,
    commitment_of,
    make_witness,
    my_witness_proof,
    trains_this_round,
)
from client_image.runtime.tasks import GuardedTasks
from client_image.runtime.verifying import VerificationDuty
from client_image.runtime.warmup import WarmupTracker
from coordinator import ClientState, CoordinatorState, NodeIdentity, RunState
from coordinator.config import P2PCheckpoint
from coordinator.messages import RoundWitness, WitnessMetadata, witness_eval_scores

log = logging.getLogger(__name__)
RECORDS_KEPT = 4  # steps of records behind the current one (apply needs s-2, health s-2)


@dataclass(frozen=True)
class RunnerOptions:
    checkpoints: CheckpointOptions = field(default_factory=CheckpointOptions)
    write_gradients_dir: Path | None = None
    apply_download_timeout_s: float = 20.0
    data_retry_delay_s: float = 2.0  # between fetches of a round's batch (see _batch)


class RoundRunner:
    def __init__(self, me: NodeIdentity, *, backend: CoordinatorLink, peers: Peers,
                 worker: Worker, open_data: DataOpener, events: EventLog,
                 counters: Counters | None = None, options: RunnerOptions | None = None,
                 tracer: PhaseTracer | None = None,
                 on_unrunnable: Callable[[str], None] | None = None,
                 idle: IdleWork | None = None):
        self.me = me
        self.idle = idle  # the evals, between epochs (evaluating.py)
        # Called when a task fails with Unrunnable (the client stops: retrying is futile).
        self.on_unrunnable = on_unrunnable
        self.backend = backend
        self.peers = peers
        self.worker = worker
        self.open_data = open_data
        self.events = events
        self.counters = counters or Counters()
        self.options = options or RunnerOptions()
        self.tracer = tracer
        self.tasks = GuardedTasks(self._task_failed)
        self.model = ModelKeeper(me, worker, peers, backend, events, self.options.checkpoints,
                                 self.tasks.spawn)
        # ---- the state of the rounds, all of it
        self.state: CoordinatorState | None = None
        self.records: dict[int, StepRecord] = {}
        self.early: dict[int, list[tuple[bytes, Broadcast]]] = {}  # gossip ahead of its round
        self.previous_epoch_clients: list[bytes] = []  # who went through the last cooldown
        self.warmup = WarmupTracker(me, backend, events, self.counters)
        self.verifying = VerificationDuty(me, worker, backend, events, self.counters)
        self.applier = ConsensusApplier(me, worker, backend, self.verifying, events,
                                        self.counters)
        self.model_fresh = False  # the model in memory is the run's current model
        self.desynced = False
        self.round_task: asyncio.Task[None] | None = None
        self.data: DataSource | None = None
        self.prefetch = BatchPrefetch()  # the round's batch, fetched as its state arrives
        self.downloads = ResultDownloads(
            worker, peers, events, self.counters, self.tasks.spawn,
            holders=lambda: self._other_clients(self.state),
            on_verified=lambda step: self._maybe_finish(step + 1))

    # ------------------------------------------------------------------ driving
    def on_state(self, state: CoordinatorState, previous: CoordinatorState | None) -> None:
        """A new coordinator state whose phase, epoch or step changed."""
        self.state = state
        self.verifying.notice(state)
        if self.idle is not None:
            self.idle.on_state(state)
        listed = state.index_of(self.me) is not None
        if state.run_state is RunState.Warmup and listed:
            if self.warmup.begin(state.progress.epoch):
                self.tasks.spawn(self._warmup(state), "warmup")
        elif state.run_state is RunState.RoundTrain and listed:
            self._start_round(state)
        elif state.run_state is RunState.RoundWitness and listed:
            self.tasks.spawn(self._witness_now(state), "witness")
        elif state.run_state is RunState.Cooldown:
            self.previous_epoch_clients = [c.id.key for c in state.epoch_state.clients]
            if listed:
                self.tasks.spawn(self._cooldown(state), "cooldown")
        if not listed:
            self.counters.role = "NotInRound"
            if state.run_state.active:
                # A round goes on without us (we were dropped or withdrawn, or are not in
                # this epoch): its results are applied everywhere but here, so the model in
                # memory is no longer the run's; the next warm-up must load it.
                self.model_fresh = False

    def on_broadcast(self, sender: bytes, broadcast: Broadcast) -> None:
        """A decoded gossip message from `sender` (verified by the gossip layer)."""
        if isinstance(broadcast, Finished) and broadcast.warmup:
            self.warmup.heard(sender)
            self.tasks.spawn(self.warmup.maybe_witness(self.state, self.model_fresh),
                             "warmup-witness")
            return
        record = self.records.get(broadcast.step)
        if record is None:
            current = self.state.progress.step if self.state else 0
            if current <= broadcast.step <= current + 2:
                self.early.setdefault(broadcast.step, []).append((sender, broadcast))
            else:
                self.counters.apply_message_ignored += 1
            return
        if isinstance(broadcast, Finished):
            record.finished_from.add(sender)
            self.counters.finishes_current += 1
            self.tasks.spawn(self._maybe_witness(record.step), "witness")
            return
        self.downloads.on_announcement(record, sender, broadcast)

    async def settle(self) -> None:
        """Wait for the current round's work to end (before stopping at Finished)."""
        if self.round_task is not None:
            with contextlib.suppress(Exception):
                await self.round_task

    async def close(self) -> None:
        if self.idle is not None:
            await self.idle.close()
        await self.tasks.close()
        await self.prefetch.close()

    def set_desynced(self, reason: str) -> None:
        if not self.desynced:
            self.events.emit(Desynced(reason=reason))
        self.desynced = True
        self.model_fresh = False
        self.prefetch.cancel_all()

    def _task_failed(self, name: str, exc: Exception) -> None:
        self.events.emit(TaskFailed(task=name, error=repr(exc), error_type=type(exc).__name__))
        self.set_desynced(f"{name} failed: {exc!r}")
        if isinstance(exc, Unrunnable) and self.on_unrunnable is not None:
            self.on_unrunnable(str(exc))

    def _phase(self, name: str, state: CoordinatorState) -> contextlib.AbstractContextManager[object]:
        return self.tracer.phase(name, state) if self.tracer else contextlib.nullcontext()

    # ------------------------------------------------------------------ warm-up
    async def _warmup(self, state: CoordinatorState) -> None:
        with self._phase("warmup", state):
            # Keep the model in memory only while the run continues from the last epoch's
            # clients (a P2P checkpoint); when the coordinator names a stored checkpoint,
            # everyone loads it, or this client would train on a model no one else has.
            continuing = isinstance(state.model.checkpoint, P2PCheckpoint)
            if not (continuing and self.worker.loaded and self.model_fresh and not self.desynced):
                await self.model.load(state, self._model_sources(state))
            if self.data is None:
                self.data = await self.open_data(state)
            await self.verifying.start_epoch(state)
            self.desynced = False
            self.model_fresh = True
            self.records.clear()
            self.applier.previous_results = {}
            self.warmup.heard(self.me.key)
            self.events.emit(Ready(epoch=state.progress.epoch))
            await self.peers.broadcast(Finished(step=state.progress.step, warmup=True))
            await self.warmup.maybe_witness(self.state, self.model_fresh)

    def _model_sources(self, state: CoordinatorState) -> list[bytes]:
        """Peers that may hold the run's model: this epoch's clients that went through the
        last cooldown, or after a restart (we saw none) all the others; shared models carry
        their step and the fetch accepts only this epoch's start step."""
        others = self._other_clients(state)
        if not self.previous_epoch_clients:
            return others
        listed = set(others)
        return [key for key in self.previous_epoch_clients if key in listed]

    def _other_clients(self, state: CoordinatorState | None) -> list[bytes]:
        """This epoch's other clients: who may hold a result besides its producer, or the
        model besides the last epoch's clients."""
        clients = state.epoch_state.clients if state is not None else []
        return [c.id.key for c in clients if c.id.key != self.me.key]

    # ------------------------------------------------------------------ training round
    def _start_round(self, state: CoordinatorState) -> None:
        step, height = state.progress.step, state.current_round.height
        if not self.worker.loaded or self.desynced or not self.model_fresh:
            return  # we rejoin at the next epoch
        if height > 0 and step - 1 not in self.records:
            self.set_desynced(f"missed the round before step {step}")
            return
        record = StepRecord.for_state(state)
        self.records[step] = record
        for old in [s for s in self.records if s < step - RECORDS_KEPT]:
            del self.records[old]
        proof = my_witness_proof(state, self.me)
        counters = self.counters
        counters.round_step = step
        counters.role = "Witness" if proof and proof[2] else (
            "Trainer" if record.batch_of(self.me.key) else "NotInRound")
        counters.finishes_previous = counters.finishes_current
        counters.announcements_previous = counters.announcements_current
        counters.downloaded_previous = counters.downloaded_current
        counters.finishes_current = counters.announcements_current = 0
        counters.downloaded_current = 0
        self.peers.forget_results_before(step - 2)
        for sender, broadcast in self.early.pop(step, []):
            self.on_broadcast(sender, broadcast)
        for stale in [s for s in self.early if s < step]:
            del self.early[stale]
        self.prefetch.cancel_before(step)
        batch = record.batch_of(self.me.key)
        if batch is not None and self.data is not None and trains_this_round(
                step, state.epoch_state.last_step):
            self.prefetch.start(step, batch, batch_fetch(self.data, batch, state.model.data_type))
        self.round_task = self.tasks.spawn(self._train_round(state, record), f"round-{step}")

    async def _train_round(self, state: CoordinatorState, record: StepRecord) -> None:
        step, height = record.step, record.height
        proof = my_witness_proof(state, self.me)
        if proof is not None and proof[2] and height >= 2 and step - 2 in self.records:
            await self.applier.health_check(state, self.records[step - 2])
        await self.verifying.begin_round(state)
        if height >= 2:
            with self._phase("apply", state):
                await self._apply(state, step)
        last_step = state.epoch_state.last_step
        if trains_this_round(step, last_step) and self.data is not None:
            with self._phase("replay", state):
                await self.verifying.replay(state, record, self.data)
        batch = record.batch_of(self.me.key)
        if batch is not None and trains_this_round(step, last_step):
            with self._phase("train", state):
                await self._train(state, record, batch)
        elif trains_this_round(step, last_step) and record.assignments:
            # Others train this step, we have no batch: the weights still take the step's
            # weight decay, as every trainer's do, or ours drift from theirs.
            await self.worker.idle(step)
        record.trained = True
        await self._maybe_finish(step)

    async def _apply(self, state: CoordinatorState, step: int) -> None:
        """Apply step s-2's consensus results (consensus_apply.py)."""
        record = self.records.get(step - 2)
        if record is None or state.previous_round is None:
            self.set_desynced(f"no record of step {step - 2} to apply")
            return
        try:
            await self.applier.apply(state, step, record,
                                     self.options.apply_download_timeout_s)
        except MissingResults as exc:
            self.set_desynced(str(exc))
            raise

    async def _train(self, state: CoordinatorState, record: StepRecord, batch: BatchKey) -> None:
        step = record.step
        tokens, data_wait_s = await self._batch(state, record, batch)
        cold_start = record.height == 0 and state.epoch_state.cold_start_epoch
        started = time.monotonic()
        out = await self.worker.train(step, tokens, batch, cold_start)
        elapsed = time.monotonic() - started
        payload = out.payload or b""
        commitment = commitment_of(step, batch, payload)
        blob_hash = self.peers.publish_result(step, payload)
        if self.options.write_gradients_dir is not None:
            directory = self.options.write_gradients_dir
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"result-{self.me.key.hex()[:16]}-step{step}-batch{batch[0]}.bin"
             ).write_bytes(payload)
        record.announce(batch, commitment, self.me.key, blob_hash, len(payload))
        record.record_verified(batch, commitment, payload)
        await self.peers.broadcast(ResultAnnouncement(
            step=step, batch_id=WireBatchId(start=batch[0], end=batch[1]),
            commitment=commitment, blob_hash=blob_hash, blob_size=len(payload)))
        self.counters.loss = out.loss
        trained_tokens = tokens.shape[0] * tokens.shape[-1]  # a Finetuning batch holds labels
        self.counters.tokens_per_sec = trained_tokens / max(elapsed, 1e-9)
        sequences = sum(end - start + 1 for start, end in record.assignments)
        self.events.emit(Trained(step=step, epoch=state.progress.epoch, loss=round(out.loss, 5),
                                 batch=batch, payload_bytes=len(payload),
                                 seconds=round(elapsed, 3), tokens=trained_tokens,
                                 ranks=out.ranks, data_wait_s=round(data_wait_s, 3),
                                 learning_rate=out.learning_rate, grad_norm=out.grad_norm,
                                 batch_tokens=sequences * state.model.max_seq_len))

    async def _batch(self, state: CoordinatorState, record: StepRecord,
                     batch: BatchKey) -> tuple[torch.Tensor, float]:
        """The round's batch and the seconds waited for it. A fetch that fails is tried
        again for as long as the round lasts: a TCP data server lives in the coordinator's
        process, so a coordinator that restarts takes it down while it holds the round for
        its clients, and giving up would lose a result the round still waits for. Once the
        round is over, or for a data server of another run, the failure stands (the round
        task fails and the runner desyncs)."""
        assert self.data is not None, "warm-up opens the data before any round"
        fetch = batch_fetch(self.data, batch, state.model.data_type)
        started = time.monotonic()
        try:
            tokens, _ = await self.prefetch.take(record.step, batch, fetch)
            return tokens, time.monotonic() - started
        except DataServerMismatch:
            raise
        except DataProviderError as exc:
            failure = exc
        while self._round_lasts(record):
            log.warning("step %d: the batch %s could not be fetched (%s): trying again while "
                        "the round lasts", record.step, batch, failure)
            await asyncio.sleep(self.options.data_retry_delay_s)
            try:
                return await fetch(), time.monotonic() - started
            except DataServerMismatch:
                raise
            except DataProviderError as exc:
                failure = exc
        raise failure

    def _round_lasts(self, record: StepRecord) -> bool:
        state = self.state
        return (state is not None and not self.desynced and state.progress.step == record.step
                and state.run_state is RunState.RoundTrain)

    # ------------------------------------------------------------------ witnessing
    async def _maybe_finish(self, step: int) -> None:
        """Gossip Finished{step} once our step is trained and all of step-1 is downloaded."""
        record = self.records.get(step)
        if record is None or not record.trained or record.finished_sent:
            return
        previous = self.records.get(step - 1)
        if record.height > 0 and previous is not None and not previous.all_downloaded():
            return
        record.finished_sent = True
        record.finished_from.add(self.me.key)
        await self.peers.broadcast(Finished(step=step))
        await self._maybe_witness(step)

    async def _maybe_witness(self, step: int) -> None:
        """Opportunistic witnessing: submit as soon as every client has finished the step."""
        state, record = self.state, self.records.get(step)
        if state is None or record is None or state.progress.step != step:
            return
        everyone = {c.id.key for c in state.epoch_state.clients if c.state is ClientState.Healthy}
        if everyone <= record.finished_from:
            await self._submit_witness(state, record)

    async def _witness_now(self, state: CoordinatorState) -> None:
        record = self.records.get(state.progress.step)
        if record is None:
            return
        if self.round_task is not None and not self.round_task.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self.round_task), 5)
        await self._submit_witness(state, record)

    async def _submit_witness(self, state: CoordinatorState, record: StepRecord) -> None:
        proof = my_witness_proof(state, self.me)
        if proof is None or not proof[2] or record.witness_sent:
            return
        record.witness_sent = True
        index, position, _ = proof
        with self._phase("witness", state):
            previous = self.records.get(record.step - 1)
            vouched = previous if record.height > 0 and previous is not None else None
            witness = make_witness(vouched, index, position, True)
            await self.backend.send_witness(RoundWitness(
                witness=witness,
                metadata=WitnessMetadata(
                    step=record.step, loss=self.counters.loss,
                    tokens_per_sec=self.counters.tokens_per_sec,
                    evals=witness_eval_scores(self.counters.evals))))
            self.counters.witnesses_sent += 1
            self.events.emit(WitnessSent(step=record.step,
                                         vouched=len(vouched.accepted_order) if vouched else 0))

    # ------------------------------------------------------------------ cooldown
    async def _cooldown(self, state: CoordinatorState) -> None:
        with self._phase("cooldown", state):
            await self.settle()
            if not self.worker.loaded or self.desynced:
                return
            await self.model.save_and_share(state)
            if self.idle is not None:
                self.idle.model_free(state)
