"""The TCP coordinator as the run-manager sees it: a read-only observer connection.

    source = TcpCoordinatorSource("127.0.0.1:20000", run_id="local-testnet")
    version = await source.client_version()   # waits for the first state (or raises)
    snapshot = await source.snapshot()        # RunSnapshot | None
    await source.close()

The source joins with `Join.observe = True` under a throwaway Ed25519 key: the server
sends it every state broadcast but never lists it as a client. A background task keeps
the connection up, reconnecting with capped exponential backoff, and keeps the latest
decoded `CoordinatorState`.

The connection and its reconnect loop are the ones every program uses
(`psyche_common.tcp`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from coordinator import StateDecodeError, decode_state
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.protocol import (
    PERMANENT_JOIN_ERRORS,
    ErrorReply,
    StateUpdate,
    VersionMismatch,
)
from psyche_common.identity import Identity
from psyche_common.run_view import ObservedState, RunSnapshot, build_snapshot
from psyche_common.tcp.connection import Backoff, JoinRefused, keep_connected, parse_host_port
from run_manager.sources.coordinator import CoordinatorUnavailable, Heard

log = logging.getLogger(__name__)


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
        self._host, self._port = parse_host_port(address, "the coordinator address")
        self.address = address
        self.run_id = run_id
        self.wait_s = wait_s
        self.connect_timeout_s = connect_timeout_s
        self.max_backoff_s = max_backoff_s
        self._identity = Identity.generate()  # throwaway: an observer signs nothing else
        self.observed: ObservedState | None = None
        self.connections = 0
        self.connected = False
        self.last_problem = "not connected yet"
        self._refused: str | None = None
        self._new_state: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_heard: float | None = None  # monotonic time of its last message

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
        if self.observed is None:
            return None
        # A lost coordinator's phase timer stops where it was last heard: it is not running.
        return build_snapshot(self.observed, None if self.connected else self._last_heard)

    def heard(self) -> Heard | None:
        if self._last_heard is None:
            return None
        return Heard(self._last_heard, self.connected,
                     "" if self.connected else self.last_problem)

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
        def lost(error: BaseException | None) -> None:
            self.connected = False
            if error is None:
                self.last_problem = "the coordinator closed the connection"
            elif isinstance(error, JoinRefused):
                self.last_problem = str(error)
                if error.error in PERMANENT_JOIN_ERRORS:
                    self._refused = (f"the coordinator at {self.address} refused to show run "
                                     f"{self.run_id!r}: {error}")
            elif isinstance(error, VersionMismatch):
                self.last_problem = f"the coordinator at {self.address} speaks another protocol: {error}"
                self._refused = self.last_problem
            else:
                self.last_problem = f"{type(error).__name__}: {error}".rstrip(": ")

        # 0.25 s, 0.5 s, 1 s, ... capped: a restarting coordinator is found quickly.
        await keep_connected(self._observe_once, stop=asyncio.Event(),
                             backoff=Backoff(first_s=0.25, max_s=self.max_backoff_s),
                             on_lost=lost)

    async def _observe_once(self) -> None:
        connection, _welcome = await ProtocolConnection.connect(
            self._host, self._port, self._identity, self.run_id, observe=True,
            timeout_s=self.connect_timeout_s)
        try:
            self.connections += 1
            self.connected = True
            self._last_heard = time.monotonic()
            while True:
                message = await connection.receive()
                self._last_heard = time.monotonic()  # a heartbeat counts: it is alive
                if isinstance(message, StateUpdate):
                    self._on_state(message)
                elif isinstance(message, ErrorReply):
                    if message.fatal:
                        raise JoinRefused(message.error, message.detail)
                    self.last_problem = f"{message.error}: {message.detail}"
        finally:
            await connection.close()

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
        self.observed = ObservedState(state, message.server_time, time.monotonic(), self.connections,
                                      joined=message.joined)
        if self._new_state is not None:
            self._new_state.set()
