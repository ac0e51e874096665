"""The client runtime: follows the coordinator, trains, shares, witnesses, checkpoints.

    WaitingForMembers / Warmup   load the model (hub directory, or peers of the last
                                 epoch), gossip Finished{warmup}, warm-up witness
    RoundTrain (step s, height h) health-check the previous round (elected witnesses,
                                 h >= 2); apply the consensus results of step s-2
                                 (h >= 2); train the assigned batch; publish the result
                                 blob and announce it; download everyone's results;
                                 gossip Finished{s} once our own work and all of step
                                 s-1 are in; an elected witness submits as soon as
                                 every client has finished (opportunistic witnessing)
    RoundWitness                 an elected witness that has not submitted does so now
    Cooldown                     checkpoint; share the model with the next joiners
Anything the client cannot follow (missed rounds, a consensus payload it cannot get) is
a desync: it stops training and rejoins cleanly at the next epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from client_image.backends.base import CoordinatorBackend, ServerState
from client_image.backends.tcp import TcpBackend
from client_image.p2p import (
    Finished,
    GossipMessage,
    GossipTopic,
    NodeConfig,
    P2PNode,
    ResultAnnouncement,
    decode_broadcast,
    encode_broadcast,
)
from client_image.p2p.messages import BatchId as WireBatchId
from client_image.runtime import round_actions
from client_image.runtime.observability import Counters, EventLog, MetricsServer, snapshot
from client_image.runtime.rounds import StepRecord, my_witness_proof
from client_image.runtime.worker import TrainingWorker
from client_image.telemetry import ClientTelemetry
from coordinator import CoordinatorState, NodeIdentity, RunState
from coordinator_tcp.protocol import ErrorReply
from psyche_common.identity import Identity

if TYPE_CHECKING:
    from client_image.data import DataProvider

log = logging.getLogger(__name__)
EXIT_VERSION_MISMATCH = 10
MAX_RESULT_BYTES = 256 * 1024 * 1024


@dataclass
class ClientOptions:
    run_id: str
    server_addr: str | None
    identity: Identity
    node_config: NodeConfig
    device: str = "cpu"
    micro_batch_size: int = 1
    checkpoint_dir: Path | None = None
    hub_repo: str | None = None  # upload each epoch's checkpoint here, then report it
    hub_token: str | None = None
    keep_steps: int = 3
    delete_old_steps: bool = True
    max_concurrent_parameter_requests: int = 8
    write_gradients_dir: Path | None = None
    metrics_local_port: int | None = None
    client_version: str | None = None  # CLIENT_VERSION: exit 10 when the run wants another
    apply_download_timeout_s: float = 20.0
    # Solana runs: the coordinator account is reached over these JSON-RPC endpoints
    # (RPC, then the fallback RPC_2) instead of a TCP server; the identity is the wallet.
    rpc: str | None = None
    rpc_2: str | None = None
    authorizer: str | None = None


class PsycheClient:
    def __init__(self, options: ClientOptions, events: EventLog):
        self.options = options
        self.events = events
        self.me = NodeIdentity(options.identity.public_key)
        self.node = P2PNode(options.identity, options.node_config)
        self.worker = TrainingWorker(device=options.device,
                                     micro_batch_size=options.micro_batch_size)
        self.counters = Counters()
        self.records: dict[int, StepRecord] = {}
        self.early: dict[int, list[GossipMessage]] = {}
        self.state: CoordinatorState | None = None
        self.last_server_state: tuple[ServerState, float] | None = None  # (state, received at)
        self.addresses: dict[str, str] = {}
        self.previous_epoch_clients: list[bytes] = []
        self.warmup_finished: set[bytes] = set()
        self.warmup_epoch: int | None = None
        self.warmup_witness_epoch: int | None = None  # the epoch our warm-up witness went for
        self.model_fresh = False  # the model in memory is the run's current model
        self.desynced = False
        self.exit_code: int | None = None
        self.stop_event = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.round_task: asyncio.Task[None] | None = None
        self.data_provider: DataProvider | None = None
        self.topic: GossipTopic | None = None
        self.backend: CoordinatorBackend | None = None
        self.metrics_server: MetricsServer | None = None
        self.telemetry: ClientTelemetry | None = None  # set by the CLI when exporting

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> int:
        await self.node.start()
        if self.options.metrics_local_port is not None:
            self.metrics_server = MetricsServer(self.options.metrics_local_port, self.metrics)
            await self.metrics_server.start()
        self.topic = self.node.subscribe(self.options.run_id)
        self.backend = self._make_backend()
        self.events.emit("started", identity=self.me.key.hex(),
                         p2p_address=self.node.address.to_string())
        gossip = asyncio.create_task(self._gossip_loop(), name="gossip")
        backend = asyncio.create_task(
            self.backend.run(self._on_state, self._on_error, self.stop_event), name="backend")
        try:
            done, _ = await asyncio.wait({backend, asyncio.create_task(self.stop_event.wait())},
                                         return_when=asyncio.FIRST_COMPLETED)
            if backend in done:
                backend.result()  # re-raise BackendRejected
        finally:
            self.stop_event.set()
            for task in [gossip, backend, *self.tasks]:
                task.cancel()
            for task in [gossip, backend, *self.tasks]:
                with contextlib.suppress(BaseException):
                    await task
            if self.metrics_server is not None:
                await self.metrics_server.stop()
            await self.node.stop()
            self.worker.close()
        return self.exit_code or 0

    def _make_backend(self) -> CoordinatorBackend:
        options, p2p_address = self.options, self.node.address.to_string()
        if options.rpc:
            from solders.keypair import Keypair
            from solders.pubkey import Pubkey

            from client_image.backends.solana import SolanaBackend, SolanaBackendOptions

            return SolanaBackend(SolanaBackendOptions(
                rpc=[options.rpc, options.rpc_2], run_id=options.run_id,
                wallet=Keypair.from_seed(options.identity.secret_key), p2p_address=p2p_address,
                client_version=options.client_version or "",
                authorizer=Pubkey.from_string(options.authorizer) if options.authorizer else None))
        if not options.server_addr:
            raise ValueError("a client needs --server-addr (TCP run) or --rpc (Solana run)")
        return TcpBackend(options.server_addr, options.identity, options.run_id, p2p_address,
                          options.client_version or "")

    def stop(self, exit_code: int = 0) -> None:
        if self.exit_code is None:
            self.exit_code = exit_code
        self.stop_event.set()

    def spawn(self, coro, name: str) -> asyncio.Task[None]:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(self._guard(coro, name), name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _guard(self, coro, name: str) -> None:  # type: ignore[no-untyped-def]
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s failed", name)
            self.events.emit("error", task=name, error=repr(exc))
            self.set_desynced(f"{name} failed: {exc!r}")

    def metrics(self):  # type: ignore[no-untyped-def]
        return snapshot(self.counters, self.options.client_version or "", self.node, self.topic)

    def set_desynced(self, reason: str) -> None:
        if not self.desynced:
            self.events.emit("desync", reason=reason)
        self.desynced = True
        self.model_fresh = False

    # ------------------------------------------------------------------ coordinator state
    def _on_error(self, reply: ErrorReply) -> None:
        self.events.emit("coordinator_error", error=reply.error, detail=reply.detail)

    async def _on_state(self, server_state: ServerState) -> None:
        state, previous = server_state.state, self.state
        self.state = state
        self.last_server_state = (server_state, time.monotonic())
        self.addresses = server_state.p2p_addresses
        self._learn_peers(state)
        wanted = state.client_version
        mine = self.options.client_version
        if mine and wanted not in (mine, "test"):
            self.events.emit("version_mismatch", wanted=wanted, running=mine)
            self.stop(EXIT_VERSION_MISMATCH)
            return
        self.counters.phase, self.counters.epoch = state.run_state.name, state.progress.epoch
        self.counters.step = state.progress.step
        changed = (previous is None or previous.run_state != state.run_state
                   or previous.progress.step != state.progress.step
                   or previous.progress.epoch != state.progress.epoch)
        if not changed:
            return
        self.events.emit("state", phase=state.run_state.name, epoch=state.progress.epoch,
                         step=state.progress.step, clients=len(state.epoch_state.clients))
        listed = state.index_of(self.me) is not None
        if state.run_state is RunState.Finished:
            self.spawn(self._finish(), "finish")
        elif state.run_state is RunState.Warmup and listed:
            if self.warmup_epoch != state.progress.epoch:
                self.warmup_epoch = state.progress.epoch
                self.warmup_finished = set()
                self.spawn(round_actions.warmup(self, state), "warmup")
        elif state.run_state is RunState.RoundTrain and listed:
            self._start_round(state, previous)
        elif state.run_state is RunState.RoundWitness and listed:
            self.spawn(round_actions.witness_now(self, state), "witness")
        elif state.run_state is RunState.Cooldown:
            self.previous_epoch_clients = [c.id.key for c in state.epoch_state.clients]
            if listed:
                self.spawn(round_actions.cooldown(self, state), "cooldown")
        if not listed:
            self.counters.role = "NotInRound"

    def _learn_peers(self, state: CoordinatorState) -> None:
        known = []
        for client in state.epoch_state.clients:
            key = client.id.key.hex()
            if client.id != self.me and key in self.addresses:
                known.append(self.addresses[key])
        if known and self.topic is not None:
            try:
                self.topic.add_peers(self.node.add_peer_addresses(known))
            except ValueError as exc:
                log.warning("bad peer address from the coordinator: %s", exc)

    def _start_round(self, state: CoordinatorState, previous: CoordinatorState | None) -> None:
        step, height = state.progress.step, state.current_round.height
        if not self.worker.loaded or self.desynced or not self.model_fresh:
            return  # we rejoin at the next epoch
        if height > 0 and step - 1 not in self.records:
            self.set_desynced(f"missed the round before step {step}")
            return
        record = StepRecord.for_state(state)
        self.records[step] = record
        for old in [s for s in self.records if s < step - 4]:
            del self.records[old]
        proof = my_witness_proof(state, self.me)
        self.counters.round_step = step
        self.counters.role = "Witness" if proof and proof[2] else (
            "Trainer" if record.batch_of(self.me.key) else "NotInRound")
        self.counters.finishes_previous = self.counters.finishes_current
        self.counters.announcements_previous = self.counters.announcements_current
        self.counters.downloaded_previous = self.counters.downloaded_current
        self.counters.finishes_current = self.counters.announcements_current = 0
        self.counters.downloaded_current = 0
        self.node.blob_store.remove_steps_before(step - 2)
        for message in self.early.pop(step, []):
            self._handle_gossip(message)
        for stale in [s for s in self.early if s < step]:
            del self.early[stale]
        self.round_task = self.spawn(round_actions.train_round(self, state, record),
                                     f"round-{step}")

    async def _finish(self) -> None:
        if self.round_task is not None:
            with contextlib.suppress(Exception):
                await self.round_task
        self.events.emit("finished", step=self.state.progress.step if self.state else 0)
        self.stop(0)

    # ------------------------------------------------------------------ gossip
    async def _gossip_loop(self) -> None:
        assert self.topic is not None
        async for message in self.topic.messages():
            self.counters.broadcasts_seen += 1
            try:
                self._handle_gossip(message)
            except Exception:
                log.exception("gossip message handling failed")

    def _handle_gossip(self, message: GossipMessage) -> None:
        try:
            broadcast = decode_broadcast(message.payload)
        except ValueError as exc:
            self.counters.apply_message_failure += 1
            log.warning("malformed broadcast from %s: %s", message.sender.hex()[:12], exc)
            return
        if isinstance(broadcast, Finished) and broadcast.warmup:
            self.warmup_finished.add(message.sender)
            self.spawn(round_actions.maybe_warmup_witness(self), "warmup-witness")
            return
        record = self.records.get(broadcast.step)
        if record is None:
            current = self.state.progress.step if self.state else 0
            if broadcast.step >= current and broadcast.step <= current + 2:
                self.early.setdefault(broadcast.step, []).append(message)
            else:
                self.counters.apply_message_ignored += 1
            return
        if isinstance(broadcast, Finished):
            record.finished_from.add(message.sender)
            self.counters.finishes_current += 1
            self.spawn(round_actions.maybe_witness(self, record.step), "witness")
            return
        self._handle_announcement(record, message.sender, broadcast)

    def _handle_announcement(self, record: StepRecord, sender: bytes,
                             announcement: ResultAnnouncement) -> None:
        batch = (announcement.batch_id.start, announcement.batch_id.end)
        if not record.expects(batch, sender) or announcement.blob_size > MAX_RESULT_BYTES:
            self.counters.apply_message_ignored += 1
            return
        if not record.announce(batch, announcement.commitment, sender, announcement.blob_hash,
                               announcement.blob_size):
            return
        self.counters.announcements_current += 1
        self.spawn(round_actions.download_result(self, record, batch, announcement.commitment),
                   f"download-{record.step}")

    async def announce(self, step: int, batch: tuple[int, int], commitment: bytes,
                       blob_hash: bytes, size: int) -> None:
        assert self.topic is not None
        await self.topic.broadcast(encode_broadcast(ResultAnnouncement(
            step=step, batch_id=WireBatchId(start=batch[0], end=batch[1]),
            commitment=commitment, blob_hash=blob_hash, blob_size=size)))

    async def broadcast_finished(self, step: int, warmup: bool = False) -> None:
        assert self.topic is not None
        await self.topic.broadcast(encode_broadcast(Finished(step=step, warmup=warmup)))

