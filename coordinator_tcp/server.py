"""The TCP coordinator server: owns the coordinator, ticks it, broadcasts its state.

One asyncio task ticks the coordinator every `tick_interval_s` with the clients that
joined (in join order) and an OS-random seed, as Psyche's server does; every tick that
changes the state, and every turn of the event loop in which client events changed it
(a round's witnesses arriving together make one), is followed by a broadcast of the
encoded state to every joined client (`coordinator_tcp.broadcaster`: the frame made
once, written straight to each connection), plus a heartbeat. Clients get the state
whole only in a connection's first update and when they ask (`ResyncAddresses`), else as a patch from the previous broadcast
(`coordinator_tcp.state_delta`: ~170 bytes for a witness instead of ~52 KB with 256
clients); observers get it whole. The p2p addresses go with it as changes
(`coordinator_tcp.addresses`): the whole map only when the state comes whole, and only
of clients connected or in the epoch. A client left out of the epoch is told why
and what it waits for (`Notice`). All coordinator calls run on the event loop thread,
one at a time.

Untrusted input is handled at the edge (`coordinator_tcp.connections`: the handshake,
size-limited frames, garbage answered with an error and a disconnect); this module
decides what a join, an event or a leave does to the run. A joined client's wire message
is read in one place, `client_event`: it becomes the coordinator's domain message
(coordinator/messages.py, the values the client's runtime gave its backend), and nothing
after it sees the wire. The rules are pure functions of the coordinator's state and the
connected clients, at the end of this file: who the server counts in (`pending_clients`)
and whose addresses the clients need (`needed_addresses`), what a client's domain message
asks of the coordinator (`apply_client_event`: the coordinator checks the rest and says
`Rejected` when the event does not apply), and what a client left out of the epoch is told
(`waiting_notices`: the epoch is full, as Psyche caps it at `MAX_CLIENTS`, or started
before it joined; once it is in, that it takes part).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

from coordinator import (
    MAX_CLIENTS,
    ClientState,
    Coordinator,
    CoordinatorError,
    CoordinatorState,
    NodeIdentity,
    Rejected,
    RunState,
    encode_state,
)
from coordinator.messages import (
    CheckpointReport,
    EvalScore,
    HealthCheck,
    RoundWitness,
    WarmupWitness,
    Withdrawal,
    WitnessMetadata,
)
from coordinator.state import VerificationReport
from coordinator.verification import FOLLOWERS_PER_TRAINER, class_shortfalls
from coordinator_tcp import protocol as wire
from coordinator_tcp.addresses import AddressBook
from coordinator_tcp.broadcaster import StateBroadcaster, fan_out
from coordinator_tcp.checkpoint_history import CheckpointHistory, HubHistory, ReportChecks
from coordinator_tcp.connections import Connections, Peer
from coordinator_tcp.persistence import StateStore
from coordinator_tcp.protocol import (
    ErrorReply,
    Heartbeat,
    Join,
    Notice,
    NoticeCode,
    ResyncAddresses,
    Welcome,
    encode,
)
from coordinator_tcp.server_options import ServerOptions, ServerStats
from coordinator_tcp.tracing import NO_TRACING, NoTracing
from psyche_common.tcp.framing import encode_frame

log = logging.getLogger(__name__)

__all__ = ["ClientEvent", "CoordinatorServer", "ServerOptions", "ServerStats",
           "apply_client_event", "client_event", "needed_addresses", "pending_clients",
           "waiting_notices"]


class CoordinatorServer:
    def __init__(
        self,
        coordinator: Coordinator,
        options: ServerOptions,
        *,
        p2p_addresses: dict[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        seed_source: Callable[[], int] = lambda: int.from_bytes(os.urandom(8), "little"),
        resumed: bool = False,
        checkpoint_history: CheckpointHistory | None = None,
    ):
        self.coordinator = coordinator
        self.options = options
        self.clock = clock
        self.seed_source = seed_source
        self.stats = ServerStats()
        self.peers: dict[NodeIdentity, Peer] = {}  # joined, in join order
        # Read-only connections (Join.observe): they get broadcasts, never join the run.
        self.observers: set[Peer] = set()
        self.addresses = AddressBook(p2p_addresses)
        self.store = StateStore(options.save_state_dir) if options.save_state_dir else None
        self.connections = Connections(options, self.stats, coordinator.state.run_id, self)
        self._stopping = False
        self._publish_due = False  # see _publish_soon
        self._tasks: list[asyncio.Task[None]] = []
        self.broadcaster = StateBroadcaster(self.addresses, self.now)
        self._last_joined = 0  # `joined` as the observers last heard it
        self._reconnect_deadline = self.now() + options.reconnect_grace_s if resumed else None
        self._original_warmup_time = coordinator.state.config.warmup_time
        self._been_active = coordinator.state.run_state.active
        self._apply_init_warmup_time()
        self.on_change: list[Callable[[CoordinatorState], None]] = []
        self.tracing: NoTracing = NO_TRACING  # spans of ticks, joins, witnesses (tracing.py)
        # (kind, payload) of each join, leave and refusal: --events-dir records them
        # (coordinator_tcp.event_recording).
        self.on_peer_event: list[Callable[[str, dict[str, object]], None]] = []
        # A Hub checkpoint report is applied only once its commit is found on main
        # (coordinator_tcp.checkpoint_history); off with --no-checkpoint-history-check.
        history = checkpoint_history or (HubHistory() if options.checkpoint_history_check
                                         else None)
        self.report_checks = ReportChecks(history) if history is not None else None

    # ------------------------------------------------------------------ lifecycle
    @property
    def state(self) -> CoordinatorState:
        return self.coordinator.state

    @property
    def p2p_addresses(self) -> dict[str, str]:
        """hex identity -> the p2p address it joined with (connected or in the epoch)."""
        return self.addresses.addresses

    @property
    def port(self) -> int:
        return self.connections.port

    def now(self) -> int:
        return int(self.clock())

    async def start(self) -> None:
        await self.connections.listen()
        self._tasks = [asyncio.create_task(self._tick_loop(), name="coordinator-tick"),
                       asyncio.create_task(self._heartbeat_loop(), name="coordinator-heartbeat")]
        self._persist()
        log.info("coordinator server for run %r listening on %s:%d",
                 self.state.run_id, self.options.host, self.port)

    async def stop(self) -> None:
        # Connections closed by our own shutdown are not clients leaving the run: a
        # restarted server must find them still listed (see reconnect_grace_s).
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.report_checks is not None:
            await self.report_checks.close()
        await self.connections.close()

    async def __aenter__(self) -> CoordinatorServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ ticking
    def _pending(self) -> list[NodeIdentity]:
        return pending_clients(self.state, self.peers.keys())

    def replay_classes(self) -> dict[NodeIdentity, int]:
        """The connected clients' replay classes (a warm-up keeps the joiners')."""
        return {identity: peer.replay_class for identity, peer in self.peers.items()}

    @property
    def resuming(self) -> bool:
        """Restarted and still waiting for listed clients to reconnect (the run holds)."""
        return self._reconnect_deadline is not None

    @property
    def pending(self) -> list[NodeIdentity]:
        """The clients connected and asking to take part (what the next tick is given)."""
        return self._pending()

    def tick_once(self) -> None:
        now = self.now()
        if self._held_after_restart(now):
            return
        mark = self.tracing.tick_started(self.state)
        result = self.coordinator.tick(self._pending(), now, self.seed_source(),
                                       self.replay_classes())
        if isinstance(result, Rejected) and self.state.run_state is not RunState.Finished:
            log.debug("tick: %s", result)
        if self.state.run_state.active and not self._been_active:
            self._been_active = True
            self._apply_init_warmup_time()
        self._publish_if_changed()
        self.tracing.tick_done(mark, self.state, result)

    async def _tick_loop(self) -> None:
        while True:
            try:
                self.tick_once()
            except Exception:  # a bug must not stop the run: log it and keep ticking
                log.exception("tick failed")
            await asyncio.sleep(self.options.tick_interval_s)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.heartbeat_interval_s)
            self._send_all(encode(Heartbeat(server_time=self.now())))

    def _apply_init_warmup_time(self) -> None:
        """--init-warmup-time replaces warmup_time until the run first becomes active."""
        init = self.options.init_warmup_time
        if init is None:
            return
        warmup = self._original_warmup_time if self._been_active else init
        self.state.config = self.state.config.model_copy(update={"warmup_time": warmup})

    def _held_after_restart(self, now: int) -> bool:
        """After a restart the run stands still until every listed client is back (or
        reconnect_grace_s passed): ticking on would time the phase out while clients are
        still reconnecting, and a round with no witnesses withdraws everyone (the step
        is counted untrained and the model falls back to the stored checkpoint). Then the
        phase in progress starts its timer afresh, so neither the outage nor the wait
        shortens it: its clients get a whole phase to finish and witness."""
        if self._reconnect_deadline is None:
            return False
        listed = [(index, client) for index, client in enumerate(self.state.epoch_state.clients)
                  if client.state is ClientState.Healthy]
        if now < self._reconnect_deadline and any(c.id not in self.peers for _, c in listed):
            return True
        self._reconnect_deadline = None
        for index, client in listed:
            if client.id not in self.peers:
                log.info("client %r did not reconnect after the restart: withdrawn", client.id)
                self.coordinator.withdraw(index)
        self.state.run_state_start_unix_timestamp = now
        log.info("resumed %s with %d of %d clients back", self.state.run_state.name,
                 sum(c.id in self.peers for _, c in listed), len(listed))
        return False

    # ------------------------------------------------------------------ broadcasting
    def state_message(self, *, observer: bool = False) -> bytes:
        """The state with the whole address map as last broadcast (a connection's first
        state, the answer to ResyncAddresses); an observer's also says how many clients
        are connected and asking to take part (`StateUpdate.joined`)."""
        return self.broadcaster.whole(self.state,
                                      joined=len(self._pending()) if observer else None)

    def _address_keys(self) -> set[str]:
        return needed_addresses(self.state, self.peers.keys())

    def publish(self) -> None:
        """Broadcast (and persist) the state if it changed: after an operator action."""
        self._publish_if_changed()

    def _publish_soon(self) -> None:
        """Broadcast once at the end of this turn of the loop: the events that arrived
        together (a round's witnesses, clients leaving in a partition) make one broadcast
        to every client, not one each. Each is applied, and answered, as it comes."""
        if self._publish_due:
            return
        self._publish_due = True

        def publish() -> None:
            self._publish_due = False
            if self._stopping:
                return
            if (not self._publish_if_changed()
                    and self.state.run_state is RunState.WaitingForMembers):
                self._notify_waiting(self.peers.values())  # those after leavers moved up

        asyncio.get_running_loop().call_soon(publish)

    def _publish_if_changed(self) -> bool:
        """Broadcast the state if it changed since the last broadcast (and tell every
        waiting peer what changed for it); whether it did."""
        started = time.perf_counter()
        encoded = encode_state(self.state)
        if self.broadcaster.is_current(encoded):
            self._tell_observers_if_joined_changed()
            return False
        pending = self._pending()
        self._last_joined = len(pending)
        messages = self.broadcaster.advance(encoded, self._address_keys(), len(pending))
        self._persist(encoded)
        self._send_all(*messages)
        self.stats.broadcasts += 1
        self.stats.broadcast_seconds.append(time.perf_counter() - started)
        self._notify_waiting(self.peers.values(), pending)
        for callback in self.on_change:
            callback(self.state)
        return True

    def _tell_observers_if_joined_changed(self, joined: int | None = None) -> None:
        """A client joined or left while the state stayed the same (WaitingForMembers
        lists nobody): the observers' dashboards say how many are there. `joined`: how
        many clients ask to take part, if already known."""
        joined = len(self._pending()) if joined is None else joined
        if joined == self._last_joined:
            return
        self._last_joined = joined
        if self.observers:
            payload = self.broadcaster.joined_changed(self.state, joined)
            for observer in fan_out(list(self.observers), payload):
                observer.writer.close()

    def save_state(self) -> None:
        """Save the state now (--save-state-dir; every change is saved as it happens, so
        this writes only what changed since): the last thing a stopping server does."""
        self._persist()

    def _persist(self, encoded: bytes | None = None) -> None:
        if self.store is not None:
            self.store.save(encoded or encode_state(self.state), self.addresses.addresses)

    def _send_all(self, payload: bytes, observer_payload: bytes | None = None) -> None:
        """`payload` to every client; `observer_payload` (or `payload`) to the observers."""
        for peer in fan_out([*self.peers.values(), *self.observers], payload,
                            observer_payload):
            log.warning("client %r is not reading: disconnecting", peer.identity)
            peer.writer.close()

    def _answer_resync(self, peer: Peer) -> None:
        """The state and the address map whole again, to a connection that asked: once
        per state and map (asking again brings nothing new, so asking costs the server
        at most one whole state per change)."""
        version = (self.broadcaster.seq, self.addresses.version)
        if peer.resynced_version == version:
            return
        peer.resynced_version = version
        peer.send(self.state_message(observer=peer.observer))

    def _notify_waiting(self, peers: Iterable[Peer],
                        pending: list[NodeIdentity] | None = None) -> None:
        """Tell each of `peers` left out of the epoch why and what it waits for (and,
        once it is in, that it takes part): one Notice each time that changes.
        `pending`: the clients asking to take part, if already known."""
        pending = self._pending() if pending is None else pending
        for peer, code, text in waiting_notices(self.state, pending, peers,
                                                self.replay_classes()):
            peer.notice = code
            peer.notice_text = text
            peer.send(encode(Notice(code=code, text=text, cap=MAX_CLIENTS)))

    # ------------------------------------------------------------------ clients (Served)
    def joined(self, message: Join, writer: asyncio.StreamWriter) -> Peer:
        """A verified Join: an observer gets the state; a client takes its place among
        the peers (the newest connection of a key wins), its address is recorded and it
        gets the state and what it waits for."""
        identity, started_ns = NodeIdentity(message.identity), self.tracing.now_ns()
        if message.observe:
            observer = Peer(identity, message.p2p_address, writer, observer=True)
            self.observers.add(observer)
            writer.write(encode_frame(encode(Welcome(identity=identity.key))))
            observer.send(self.state_message(observer=True))
            log.info("observer %r connected", identity)
            self._peer_event("joined", observer)
            return observer
        previous = self.peers.pop(identity, None)
        if previous is not None:  # the same key reconnected: the newest connection wins
            previous.writer.close()
        peer = Peer(identity, message.p2p_address, writer, replay_class=message.replay_class)
        self.peers[identity] = peer
        moved = self.addresses.get(identity.key.hex()) != message.p2p_address
        self.addresses.set(identity.key.hex(), message.p2p_address)
        writer.write(encode_frame(encode(Welcome(identity=identity.key))))
        peer.send(self.state_message())
        pending = self._pending()  # one pass over the connected clients per join
        if moved and self.state.index_of(identity) is not None:
            # A listed client came back on a new address (a restarted process): its peers
            # must dial the new one now, not at the next state change.
            encoded = encode_state(self.state)
            messages = self.broadcaster.advance(encoded, self._address_keys(), len(pending))
            self._persist(encoded)
            self._send_all(*messages)
        self._tell_observers_if_joined_changed(len(pending))
        # Between epochs a join can make another joiner's replay class too small or big
        # enough (verified runs): every waiting peer is looked at, and told if that changed.
        self._notify_waiting(self.peers.values() if self.state.run_state
                             is RunState.WaitingForMembers else [peer], pending)
        log.info("client %r joined from %s", identity, writer.get_extra_info("peername"))
        self.tracing.joined(started_ns, identity.key.hex(), message.p2p_address, self.state,
                            len(pending))
        self._peer_event("joined", peer)
        return peer

    def event(self, peer: Peer, message: object) -> None:
        """Apply one client message now, answer a rejected one, broadcast at the end of
        this turn of the loop (`_publish_soon`). A checkpoint report waits for the check of
        its commit against the Hub (`report_checks`), refused like any other event."""
        if isinstance(message, ResyncAddresses):  # the connection's, not the run's
            self._answer_resync(peer)
            self._answer(peer, None)
            return
        event = client_event(message, peer.identity)
        if (self.report_checks is not None and isinstance(event, CheckpointReport)
                and not peer.observer):
            self.report_checks.start(self.state, peer.identity, event, lambda refused: (
                self._answer(peer, refused or self._apply(peer, event))))
            return
        self._answer(peer, self._apply(peer, event))

    def _answer(self, peer: Peer, rejected: Rejected | None) -> None:
        if rejected is not None:
            self.stats.rejected_events += 1
            self._peer_event("refused", peer, error=rejected.error.name, detail=str(rejected))
            peer.send(encode(ErrorReply(error=rejected.error.name, detail=str(rejected))))
        self._publish_soon()

    def _apply(self, peer: Peer, event: ClientEvent | Rejected | None) -> Rejected | None:
        sender, now = peer.identity, self.now()
        if peer.observer:
            return Rejected(CoordinatorError.WrongRunState,
                            "an observer connection is read-only: join without observe to act")
        if event is None or isinstance(event, Rejected):
            return event
        if isinstance(event, Withdrawal):
            self.peers.pop(sender, None)  # leaving for good: not a client to tick with
        started_ns = self.tracing.now_ns()
        rejected = apply_client_event(self.coordinator, sender, event, now, self.seed_source)
        self.tracing.witnessed(started_ns, sender.key.hex(), event, rejected, self.state)
        return rejected

    def _peer_event(self, kind: str, peer: Peer, **more: object) -> None:
        for callback in self.on_peer_event:
            callback(kind, {"identity": peer.identity.key.hex(), "observer": peer.observer,
                            "p2p_address": peer.p2p_address, **more})

    def left(self, peer: Peer) -> None:
        self._peer_event("left", peer)
        if peer.observer:
            self.observers.discard(peer)
            peer.writer.close()
            return
        if self._stopping:
            peer.writer.close()
            return
        if self.peers.get(peer.identity) is peer:
            del self.peers[peer.identity]
            # From the cooldown on, the listed clients are the epoch's holders of its model
            # (in memory, and in the checkpoint they write in the cooldown). Withdrawing one
            # that restarts would make the next warm-up fall back to the stored checkpoint
            # though it comes back and can serve the model from that checkpoint; whether
            # it is in the next epoch is decided by its joining again, not by this list.
            # (Killed before it wrote the checkpoint, it cannot serve: if it was the only
            # holder, the next epoch's first round goes unwitnessed and the one after
            # falls back, one epoch later than before.)
            between_epochs = self.state.run_state in (RunState.Cooldown,
                                                      RunState.WaitingForMembers)
            if self.options.withdraw_on_disconnect and not between_epochs:
                index = self.state.index_of(peer.identity)
                if index is not None and not self.state.run_state.halted:
                    self.coordinator.withdraw(index)
            self._publish_soon()
        peer.writer.close()
        log.info("client %r disconnected", peer.identity)


# ---------------------------------------------------------------------- the run's rules
def pending_clients(state: CoordinatorState,
                    connected: Collection[NodeIdentity]) -> list[NodeIdentity]:
    """Connected clients asking to take part, in join order.

    As in Psyche, clients the coordinator removed this epoch (Dropped by a health check,
    Ejected) are left out, so a faulty client sits out one epoch. Clients that were
    Withdrawn (they left or their connection dropped) and came back are welcome. And when
    leaving the removed ones out would keep the run from ever starting (fewer than
    init_min_clients otherwise), they are let in too: liveness first.
    """
    removed = {c.id for c in state.epoch_state.exited_clients
               if c.state in (ClientState.Dropped, ClientState.Ejected)}
    preferred = [node for node in connected if node not in removed]
    if (state.run_state is RunState.WaitingForMembers
            and len(preferred) < state.config.init_min_clients <= len(connected)):
        return list(connected)
    return preferred


def needed_addresses(state: CoordinatorState, connected: Collection[NodeIdentity]) -> set[str]:
    """Whose addresses (hex keys) the clients need: those connected (asking to take part)
    and the epoch's, listed and exited. The rest (clients that left) are dropped."""
    epoch = state.epoch_state
    return {*(node.key.hex() for node in connected),
            *(client.id.key.hex() for client in epoch.clients),
            *(client.id.key.hex() for client in epoch.exited_clients)}


ClientEvent = (RoundWitness | WarmupWitness | HealthCheck | CheckpointReport
               | VerificationReport | Withdrawal)
"""What a joined client can ask of the run: the coordinator's domain messages."""


def client_event(message: object, sender: NodeIdentity) -> ClientEvent | Rejected | None:
    """The one seam between the TCP wire and the run: a joined client's decoded wire
    message (`protocol.decode_client_message`) as the domain message it carries, the
    same values the client's runtime gave its backend (client_image/backends/tcp.py
    `wire_message` is the other direction). A message that carries none is refused
    (`Rejected`); None for one that asks nothing of the run."""
    if isinstance(message, wire.WitnessSubmit):
        return RoundWitness(message.witness.to_witness(), domain_metadata(message.metadata))
    if isinstance(message, wire.WarmupWitness):
        return WarmupWitness(message.witness.to_witness())
    if isinstance(message, wire.HealthCheck):
        return HealthCheck(tuple(entry.to_pair() for entry in message.checks))
    if isinstance(message, wire.CheckpointReport):
        repo = message.hub or message.gcs
        if repo is None:
            return Rejected(CoordinatorError.InvalidCheckpoint, "neither hub nor gcs given")
        return CheckpointReport(message.index, repo)
    if isinstance(message, wire.VerificationReportMessage):
        # No reporter on the wire: a report is the key's that signed the connection's join.
        return message.to_report(sender)
    if isinstance(message, wire.Withdraw):
        return Withdrawal()
    if isinstance(message, Join):
        return Rejected(CoordinatorError.WrongRunState, "already joined")
    return None


def domain_metadata(metadata: wire.WitnessMetadata) -> WitnessMetadata:
    return WitnessMetadata(
        step=metadata.step, loss=metadata.loss, tokens_per_sec=metadata.tokens_per_sec,
        bandwidth_per_sec=metadata.bandwidth_per_sec,
        evals=tuple(EvalScore(name=e.name, value=e.value) for e in metadata.evals))


def apply_client_event(coordinator: Coordinator, sender: NodeIdentity, event: ClientEvent,
                       now: int, seed_source: Callable[[], int]) -> Rejected | None:
    """Apply `event` from `sender` at `now`; None when applied (or nothing to do)."""
    if isinstance(event, WarmupWitness):
        return coordinator.warmup_witness(sender, event.witness, now, seed_source())
    if isinstance(event, RoundWitness):
        return coordinator.witness(sender, event.witness, now)
    if isinstance(event, HealthCheck):
        return coordinator.health_check(sender, list(event.checks))
    if isinstance(event, CheckpointReport):
        return coordinator.checkpoint(sender, event.index, event.repo)
    if isinstance(event, VerificationReport):
        return coordinator.verification_report(sender, event)
    index = coordinator.state.index_of(sender)  # a Withdrawal
    return None if index is None else coordinator.withdraw(index)


_TRAINING = (RunState.Warmup, RunState.RoundTrain, RunState.RoundWitness, RunState.Cooldown)


def waiting_notices(state: CoordinatorState, pending: list[NodeIdentity],
                    peers: Iterable[Peer],
                    replay_classes: Mapping[NodeIdentity, int] | None = None
                    ) -> Iterator[tuple[Peer, NoticeCode, str]]:
    """(peer, code, text) for each of `peers` with something new to be told (a notice
    other than the last it got); `pending` are the clients asking to take part, in join
    order, and `replay_classes` their classes (a verified epoch lists a class only when
    enough of the joiners share it: coordinator/verification.py class_shortfalls)."""
    run_state = state.run_state
    shortfalls = class_shortfalls(pending, replay_classes or {},
                                  state.config.verification_percent)

    def class_notice(peer: Peer) -> tuple[NoticeCode, str] | None:
        short = shortfalls.get(peer.identity)
        if short is None:
            return None
        more = f"{short} more client{'s' if short > 1 else ''}"
        return "replay_class", (
            f"waiting for {more} of this client's replay class: a verified run lists a "
            f"class only when at least {FOLLOWERS_PER_TRAINER + 1} of its joiners "
            f"({FOLLOWERS_PER_TRAINER} when only {FOLLOWERS_PER_TRAINER} joined) share it, so "
            "that its followers can replay it; or restart this client with REPLAY_CLASS=none "
            "to join without a class, judged with the loose limits")

    if run_state is RunState.WaitingForMembers:
        positions = {node: i for i, node in enumerate(pending)}
        for peer in peers:
            position = positions.get(peer.identity)
            told = class_notice(peer)
            if told is not None:
                if (peer.notice, peer.notice_text) != told:  # the shortfall may have moved
                    yield peer, *told
            elif (position is not None and position >= MAX_CLIENTS
                  and peer.notice != "epoch_full"):
                yield peer, "epoch_full", (
                    f"the epoch is full ({MAX_CLIENTS} clients): waiting for the next one "
                    f"({position} clients joined before this one)")
        return
    if run_state not in _TRAINING:
        return  # paused, finished: the state says what the run waits for
    listed = {client.id for client in state.epoch_state.clients}
    # The same words for every waiting peer: made once per state, not once per peer.
    left_out: tuple[NoticeCode, str] = (
        ("epoch_full", f"the epoch is full ({MAX_CLIENTS} clients): waiting for the next one")
        if len(listed) >= MAX_CLIENTS else
        ("epoch_started", f"the epoch started before this client joined ({run_state.name}, "
                          f"{len(listed)} clients): waiting for the next one"))
    for peer in peers:
        if peer.identity in listed:
            if peer.notice is not None and peer.notice != "taking_part":
                yield peer, "taking_part", "taking part in the epoch"
            continue
        # Told at the warm-up that its replay class was too small: that still holds (who is
        # pending now says nothing of who was then), until the next WaitingForMembers.
        if peer.notice not in (left_out[0], "replay_class"):
            yield peer, *left_out
