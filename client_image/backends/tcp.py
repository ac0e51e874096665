"""The client's TCP backend: join a `psyche-coordinator` server and follow its states.

The connection is the shared `psyche_common.tcp.Connection`, kept up by
`keep_connected` (capped, jittered backoff) when it drops (a restarted server, a network
blip); each new connection re-joins with a fresh signed challenge. A refusal retrying
cannot fix (wrong run id, bad signature, another protocol version) is raised as
`BackendRejected` so the client exits with a clear message.

The p2p addresses come as changes after a whole first map (`coordinator_tcp.addresses`);
when one does not follow the last the backend asks for the whole map again and hands
the client the best map it has meanwhile. A `Notice` (left out of a full or started
epoch, waiting for the next) goes to the log.

Nothing the client says is lost to a restart: a message sent while disconnected waits
for the next connection (up to `reconnect_wait_s`), and the messages sent in the last
`replay_window_s` before a connection dropped are sent again on the next one (the server
may have died before reading them; a repeat is refused as a duplicate, harmlessly).

The runtime speaks the domain messages of `coordinator.messages` (the typed port of
`base.py`); this backend wraps each in its wire message of `coordinator_tcp.protocol`,
and hands a refusal (`ErrorReply`) to the runtime as a `Refusal`.

Except a witness for a step that is over: a connection counts as up once its first state
has come, and a WitnessSubmit goes only while the coordinator is at the step it was made
for (its `metadata.step`, which the round runner sets). A restarted coordinator already
at the next step, with the same client elected again, would otherwise take the replayed
witness as that step's: its blooms vouch for the step before, so none of the results of
the step in flight would reach a quorum, and every client would skip them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from pydantic import BaseModel

from client_image.backends.base import (
    BackendRejected,
    ErrorCallback,
    ServerState,
    StateCallback,
)
from coordinator import StateDecodeError, decode_state
from coordinator.config import HubCheckpoint
from coordinator.messages import (
    CheckpointReport,
    HealthCheck,
    Refusal,
    RoundWitness,
    WarmupWitness,
    WitnessMetadata,
)
from coordinator.state import VerificationReport
from coordinator_tcp import protocol as wire
from coordinator_tcp.addresses import AddressMirror
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.protocol import (
    PERMANENT_JOIN_ERRORS,
    ErrorReply,
    Notice,
    ResyncAddresses,
    StateUpdate,
    VersionMismatch,
    WitnessSubmit,
)
from coordinator_tcp.state_delta import StateMirror
from psyche_common.identity import Identity
from psyche_common.tcp.connection import (
    CONNECTION_ERRORS,
    Backoff,
    Connection,
    JoinRefused,
    keep_connected,
    parse_host_port,
)

log = logging.getLogger(__name__)


class TcpBackend:
    def __init__(self, server_addr: str, identity: Identity, run_id: str, p2p_address: str,
                 client_version: str = "", *, replay_class: int = 0,
                 max_backoff_s: float = 5.0,
                 connect_timeout_s: float = 5.0, reconnect_wait_s: float = 30.0,
                 replay_window_s: float = 5.0):
        self.host, self.port = parse_host_port(server_addr, "--server-addr")
        self.identity = identity
        self.run_id = run_id
        self.p2p_address = p2p_address
        self.client_version = client_version
        self.replay_class = replay_class  # sent in every Join (formats/replay_settings.py)
        self.backoff = Backoff(first_s=0.25, max_s=max_backoff_s)
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_wait_s = reconnect_wait_s
        self.replay_window_s = replay_window_s
        self._connection: Connection | None = None
        self._recent: deque[tuple[float, BaseModel]] = deque(maxlen=64)
        self._replay: list[BaseModel] = []
        self.addresses = AddressMirror()
        self.states = StateMirror()
        self.notice: Notice | None = None  # the last thing the coordinator said we wait for
        self.connected = asyncio.Event()  # set once a connection has brought its first state
        self._step: int | None = None  # the coordinator's step, as this connection last said

    async def run(self, on_state: StateCallback, on_error: ErrorCallback,
                  stop: asyncio.Event) -> None:
        """Stay connected until `stop` is set; reconnect with jittered backoff."""

        async def session() -> None:
            await self._session(on_state, on_error)

        def lost(error: BaseException | None) -> None:
            if error is not None:
                log.warning("coordinator connection lost: %r", error)

        await keep_connected(session, stop=stop, backoff=self.backoff, on_lost=lost)

    async def _session(self, on_state: StateCallback, on_error: ErrorCallback) -> None:
        try:
            connection, _welcome = await ProtocolConnection.connect(
                self.host, self.port, self.identity, self.run_id, self.p2p_address,
                client_version=self.client_version, replay_class=self.replay_class,
                timeout_s=self.connect_timeout_s)
        except JoinRefused as refused:
            if refused.error in PERMANENT_JOIN_ERRORS:
                raise BackendRejected(str(refused)) from None
            raise
        except VersionMismatch as mismatch:
            raise BackendRejected(f"the coordinator at {self.host}:{self.port} speaks another "
                                  f"protocol: {mismatch}") from None
        self._connection = connection
        self._step = None
        self.addresses.reset()
        self.states.reset()
        try:
            while True:
                message = await connection.receive()
                if isinstance(message, StateUpdate):
                    address_gap = self.addresses.apply(message)
                    state_bytes, state_gap = self.states.apply(message)
                    if address_gap or state_gap:
                        log.warning("missed a change of the coordinator's %s (state %s, map "
                                    "%s): asking for the whole state and map",
                                    "state" if state_gap else "p2p addresses",
                                    message.state_seq, message.addresses_seq)
                        await connection.send(ResyncAddresses())
                    if state_bytes is None:
                        continue  # a patch that did not follow: the whole state is coming
                    try:
                        state = decode_state(state_bytes)
                    except (StateDecodeError, ValueError) as exc:
                        log.error("undecodable coordinator state: %s", exc)
                        continue
                    self._step = state.progress.step
                    if not self.connected.is_set():
                        # Up from the first state on: what waits, or is replayed, is sent
                        # against the step the coordinator is at now (see `_send_wire`).
                        self.connected.set()
                        replay, self._replay = self._replay, []
                        for queued in replay:
                            await self._send_wire(queued)
                    await on_state(ServerState(state, dict(self.addresses.addresses),
                                               message.server_time))
                elif isinstance(message, Notice):
                    self.notice = message
                    if message.code == "taking_part":
                        log.info("coordinator: %s", message.text)
                    else:
                        log.warning("coordinator: %s", message.text)
                elif isinstance(message, ErrorReply):
                    if message.fatal and message.error in PERMANENT_JOIN_ERRORS:
                        raise BackendRejected(f"{message.error}: {message.detail}")
                    on_error(Refusal(error=message.error, detail=message.detail))
                # Heartbeats only keep the connection alive.
        finally:
            self.connected.clear()
            self._connection = None
            since = time.monotonic() - self.replay_window_s
            recent = [message for sent, message in self._recent if sent >= since]
            self._replay = [*recent, *self._replay]
            self._recent.clear()
            await connection.close()

    # ---------------------------------------------------------------- the typed port
    async def send_witness(self, witness: RoundWitness) -> bool:
        return await self._send_wire(wire_message(witness))

    async def send_warmup_witness(self, witness: WarmupWitness) -> bool:
        return await self._send_wire(wire_message(witness))

    async def send_health_check(self, check: HealthCheck) -> bool:
        return await self._send_wire(wire_message(check))

    async def report_checkpoint(self, report: CheckpointReport) -> bool:
        return await self._send_wire(wire_message(report))

    async def report_verification(self, report: VerificationReport) -> bool:
        return await self._send_wire(wire_message(report))

    async def withdraw(self) -> bool:
        """Send Withdraw only over a connection that is up now: a client that stops does
        not wait for a coordinator it cannot reach."""
        if not self.connected.is_set():
            return False
        return await self._send_wire(wire.Withdraw())

    async def _send_wire(self, message: BaseModel) -> bool:
        """Send one wire message, waiting up to `reconnect_wait_s` for a connection; False if
        none came (the caller decides whether it matters)."""
        if not self.connected.is_set():
            try:
                await asyncio.wait_for(self.connected.wait(), self.reconnect_wait_s)
            except TimeoutError:
                return False
        connection = self._connection
        if connection is None:
            return False
        if (isinstance(message, WitnessSubmit) and self._step is not None
                and message.metadata.step != self._step):
            log.warning("a witness of step %d not sent: the coordinator is at step %d",
                        message.metadata.step, self._step)
            return False
        try:
            await connection.send(message)
        except CONNECTION_ERRORS:
            self._replay.append(message)  # the next connection sends it
            return False
        self._recent.append((time.monotonic(), message))
        return True



DomainMessage = RoundWitness | WarmupWitness | HealthCheck | CheckpointReport | VerificationReport
WireMessage = (wire.WitnessSubmit | wire.WarmupWitness | wire.HealthCheck | wire.CheckpointReport
               | wire.VerificationReportMessage)


def wire_message(message: DomainMessage) -> WireMessage:
    """The TCP protocol's message for a domain message (the server decodes it back to the
    same values: `coordinator_tcp.server.client_event`)."""
    if isinstance(message, RoundWitness):
        return wire.WitnessSubmit(witness=wire.WitnessModel.of(message.witness),
                                  metadata=wire_metadata(message.metadata))
    if isinstance(message, WarmupWitness):
        return wire.WarmupWitness(witness=wire.WitnessModel.of(message.witness))
    if isinstance(message, HealthCheck):
        return wire.HealthCheck(checks=[
            wire.HealthCheckEntry.model_validate(
                {"node": node.key, "committee": proof.committee.name,
                 "position": proof.position, "index": proof.index})
            for node, proof in message.checks])
    if isinstance(message, CheckpointReport):
        if isinstance(message.repo, HubCheckpoint):
            return wire.CheckpointReport(index=message.index, hub=message.repo)
        return wire.CheckpointReport(index=message.index, gcs=message.repo)
    # No reporter on the wire: the server attributes a report to the connection's key.
    return wire.VerificationReportMessage(
        accused=message.accused.key, step=message.step,
        published_hash=message.published_hash, expected_hash=message.expected_hash,
        jaccard_ppm=message.jaccard_ppm, hamming_ppm=message.hamming_ppm,
        manhattan_ppm=message.manhattan_ppm)


def wire_metadata(metadata: WitnessMetadata) -> wire.WitnessMetadata:
    return wire.WitnessMetadata(
        step=metadata.step, loss=metadata.loss, tokens_per_sec=metadata.tokens_per_sec,
        bandwidth_per_sec=metadata.bandwidth_per_sec,
        evals=[wire.WitnessEval(name=score.name, value=score.value)
               for score in metadata.evals])
