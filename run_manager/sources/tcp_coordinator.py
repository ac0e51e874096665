"""The TCP coordinator as the run-manager sees it: a read-only observer connection.

    source = TcpCoordinatorSource("127.0.0.1:20000", run_id="local-testnet")
    version = await source.client_version()   # waits for the first state (or raises)
    snapshot = await source.snapshot()        # RunSnapshot | None
    await source.close()

The source joins with `Join.observe = True` under a throwaway Ed25519 key: the server
sends it every state broadcast but never lists it as a client. A background task keeps
the connection up, reconnecting with capped exponential backoff, and keeps the latest
decoded `CoordinatorState`.

Why not `coordinator_tcp.client.ProtocolConnection`: it signs with the client's
`Identity`, whose package (`client_image.p2p`) imports iroh and torch; the run-manager
speaks the same three-message handshake here with `cryptography` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from coordinator import (
    CoordinatorState,
    RunState,
    SelectionError,
    StateDecodeError,
    decode_state,
    selection_for_round,
    witness_quorum,
)
from coordinator_tcp.framing import CLIENT_MAX_FRAME, FrameError, read_frame, write_frame
from coordinator_tcp.protocol import (
    PERMANENT_JOIN_ERRORS,
    Challenge,
    ErrorReply,
    Join,
    ProtocolError,
    StateUpdate,
    Welcome,
    decode_server_message,
    encode,
    join_signing_bytes,
)
from run_manager.sources.coordinator import (
    CoordinatorUnavailable,
    RunClient,
    RunSnapshot,
    WitnessProgress,
)

log = logging.getLogger(__name__)

# Refusals that reconnecting cannot fix: reported as they are, not as "unreachable".


@dataclass(frozen=True)
class ObservedState:
    state: CoordinatorState
    server_time: int
    """The server's unix time (seconds) when it sent the state; 0 when it did not say."""
    received_monotonic: float
    connection: int
    """Which connection delivered it (counts up with every successful handshake)."""


def phase_timeout_s(state: CoordinatorState) -> float | None:
    """How long the current phase lasts at most; None when it ends on an event only."""
    config = state.config
    timeouts = {
        RunState.WaitingForMembers: config.waiting_for_members_extra_time,
        RunState.Warmup: config.warmup_time,
        RunState.RoundTrain: config.max_round_train_time,
        RunState.RoundWitness: config.round_witness_time,
        RunState.Cooldown: config.cooldown_time,
    }
    timeout = timeouts.get(state.run_state)
    return None if timeout is None else float(timeout)


def witness_progress(state: CoordinatorState) -> WitnessProgress:
    """This round's elected witnesses, those whose witness message arrived, and quorum.

    elected  = selection_for_round(state).witness_indices(), as ids via client_at
    received = the current round's stored witnesses (warm-up witnesses during Warmup)
    quorum   = witness_quorum(W), W = config.witness_count(len(clients))
    """
    clients = state.epoch_state.clients
    target = state.config.witness_count(len(clients))
    round_ = state.current_round
    elected: list[str] = []
    received: list[str] = []
    if state.run_state in (RunState.Warmup, RunState.RoundTrain, RunState.RoundWitness):
        if state.run_state is not RunState.Warmup:
            try:
                indices = selection_for_round(state).witness_indices()
            except SelectionError:
                indices = []  # a round with no clients elects nobody
            for index in indices:
                client = state.client_at(index, round_.clients_len)
                if client is not None:
                    elected.append(client.id.key.hex())
        for witness in round_.witnesses:
            # The coordinator checked proof.index against the epoch's client list.
            index = witness.proof.index
            client = clients[index] if 0 <= index < len(clients) else state.client_at(
                index, round_.clients_len)
            if client is not None:
                received.append(client.id.key.hex())
    return WitnessProgress(elected=elected, received=received, quorum=witness_quorum(target))


def build_snapshot(observed: ObservedState, now_monotonic: float | None = None) -> RunSnapshot:
    """The RunSnapshot of an observed state; phase time runs on the server's clock."""
    state = observed.state
    now = time.monotonic() if now_monotonic is None else now_monotonic
    # Elapsed = (server time at send - phase start) + time since we received it: no
    # dependence on this machine's wall clock agreeing with the coordinator's.
    server_now = (observed.server_time or time.time()) + max(0.0, now - observed.received_monotonic)
    started = state.run_state_start_unix_timestamp
    # A run fresh from its state.toml has no phase start yet (0): no elapsed time to show.
    elapsed = 0.0 if started == 0 else max(0.0, server_now - started)
    points = {entry.id.key: entry.earned for entry in state.rewards.entries}
    clients = [
        RunClient(id=c.id.key.hex(), state=c.state.name, points=points.get(c.id.key))  # type: ignore[arg-type]
        for c in state.epoch_state.clients
    ]
    return RunSnapshot(
        run_id=state.run_id,
        phase=state.run_state.name,  # type: ignore[arg-type]
        phase_elapsed_s=elapsed,
        phase_timeout_s=phase_timeout_s(state),
        epoch=state.progress.epoch,
        step=state.progress.step,
        clients=clients,
        witnesses=witness_progress(state),
        client_version=state.client_version,
    )


class TcpCoordinatorSource:
    """A `CoordinatorSource` for a run on a TCP coordinator (`host:port`)."""

    def __init__(
        self,
        address: str,
        run_id: str,
        *,
        wait_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        max_backoff_s: float = 5.0,
    ) -> None:
        host, separator, port = address.rpartition(":")
        if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"coordinator address must be host:port, got {address!r}")
        self.address = address
        self._host, self._port = host.strip("[]"), int(port)
        self.run_id = run_id
        self.wait_s = wait_s
        self.connect_timeout_s = connect_timeout_s
        self.max_backoff_s = max_backoff_s
        self._key = Ed25519PrivateKey.generate()  # throwaway: an observer signs nothing else
        self.observed: ObservedState | None = None
        self.connections = 0
        self.connected = False
        self.last_problem = "not connected yet"
        self._refused: str | None = None
        self._new_state: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ CoordinatorSource
    async def client_version(self) -> str:
        """The version the run wants, from a state received on the live connection.

        After a lost connection the last state may be stale (the coordinator may have
        restarted with another version), so this waits for a fresh one, up to `wait_s`.
        """
        observed = await self._fresh_state()
        return observed.state.client_version

    async def snapshot(self) -> RunSnapshot | None:
        self._ensure_running()
        return None if self.observed is None else build_snapshot(self.observed)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None or task.done():
            return
        if self._loop is not asyncio.get_running_loop():
            # Started on another event loop (asyncio.run ended it and cancelled the task).
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    # ------------------------------------------------------------------ internals
    def _ensure_running(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is not None and self._loop is loop and not self._task.done():
            return
        # First use, or first use on a new event loop (the CLI runs the TUI and the
        # clean-up on different loops): the old loop's connection died with it.
        self._loop = loop
        self._new_state = asyncio.Event()
        self.connected = False
        self._task = loop.create_task(self._stay_connected(), name=f"observe {self.address}")

    async def _fresh_state(self) -> ObservedState:
        self._ensure_running()
        assert self._new_state is not None
        deadline = time.monotonic() + self.wait_s
        while True:
            observed = self.observed
            if self._refused is not None:
                raise CoordinatorUnavailable(self._refused)
            if observed is not None and self.connected and observed.connection == self.connections:
                return observed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CoordinatorUnavailable(
                    f"no state from the coordinator at {self.address} (run {self.run_id!r}) "
                    f"within {self.wait_s:g}s: {self.last_problem}. Is `psyche-coordinator run` "
                    "up there, and COORDINATOR_ADDRESS right?"
                )
            self._new_state.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new_state.wait(), min(remaining, 0.5))

    async def _stay_connected(self) -> None:
        failures = 0
        while True:
            try:
                await self._observe_once()
                failures = 0
                self.last_problem = "the coordinator closed the connection"
            except _Refused as refusal:
                self.last_problem = str(refusal)
                if refusal.error in PERMANENT_JOIN_ERRORS:
                    self._refused = (
                        f"the coordinator at {self.address} refused to show run "
                        f"{self.run_id!r}: {refusal}"
                    )
            except (OSError, TimeoutError, asyncio.IncompleteReadError, FrameError,
                    ProtocolError) as error:  # fmt: skip
                self.last_problem = f"{type(error).__name__}: {error}".rstrip(": ")
            finally:
                self.connected = False
            failures += 1
            # 0.25 s, 0.5 s, 1 s, ... capped: a restarting coordinator is found quickly.
            await asyncio.sleep(min(self.max_backoff_s, 0.25 * 2 ** min(failures - 1, 8)))

    async def _observe_once(self) -> None:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self._host, self._port, limit=2**16), self.connect_timeout_s
        )
        try:
            await asyncio.wait_for(self._handshake(reader, writer), self.connect_timeout_s)
            self.connections += 1
            self.connected = True
            while True:
                message = decode_server_message(await read_frame(reader, CLIENT_MAX_FRAME))
                if isinstance(message, StateUpdate):
                    self._on_state(message)
                elif isinstance(message, ErrorReply):
                    if message.fatal:
                        raise _Refused(message)
                    self.last_problem = f"{message.error}: {message.detail}"
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        challenge = decode_server_message(await read_frame(reader, CLIENT_MAX_FRAME))
        if isinstance(challenge, ErrorReply):
            raise _Refused(challenge)
        if not isinstance(challenge, Challenge):
            raise ProtocolError(f"expected a challenge, got {challenge.type!r}")
        public_key = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        signature = self._key.sign(join_signing_bytes(challenge.nonce, self.run_id, ""))
        join = Join(run_id=self.run_id, identity=public_key, p2p_address="",
                    signature=signature, observe=True)  # fmt: skip
        await write_frame(writer, encode(join))
        reply = decode_server_message(await read_frame(reader, CLIENT_MAX_FRAME))
        if isinstance(reply, ErrorReply):
            raise _Refused(reply)
        if not isinstance(reply, Welcome):
            raise ProtocolError(f"expected a welcome, got {reply.type!r}")

    def _on_state(self, message: StateUpdate) -> None:
        try:
            state = decode_state(message.state_bytes)
        except (StateDecodeError, ValueError) as error:
            # A bad broadcast is logged and skipped; the last good state stays.
            self.last_problem = f"undecodable state from the coordinator: {error}"
            log.warning("coordinator %s: %s", self.address, self.last_problem)
            return
        if state.run_id != self.run_id:
            self.last_problem = f"the coordinator sent run {state.run_id!r}, not {self.run_id!r}"
            return
        self.observed = ObservedState(state, message.server_time, time.monotonic(), self.connections)
        if self._new_state is not None:
            self._new_state.set()


class _Refused(Exception):
    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(f"{reply.error}: {reply.detail}" if reply.detail else reply.error)
        self.error = reply.error
