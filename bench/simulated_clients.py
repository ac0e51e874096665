"""The simulated clients of bench/server_load.py: the coordinator protocol, no training.

Each is an `asyncio.Protocol` on its own loopback source address: it answers the
server's Challenge with a signed Join, takes the Welcome, then reads every state the
server broadcasts as its bytes arrive (`data_received`, no task per frame): the time it
read each one, its bytes, and what it must do, the warm-up witness and each round's
witness when elected (proofs from `selection_for_round`, as a real client's). Hundreds
share one process, so each broadcast is decoded once per process (`StateCache`), and
the per-frame cost is a few microseconds: the process measures the server, not itself.

    client_process(range(0, 500), port, shared)   # a process's share, run by the bench
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from coordinator import (
    CoordinatorState,
    RunState,
    Witness,
    WitnessProof,
    decode_state,
    selection_for_round,
)
from coordinator_tcp.client import JoinRefused
from coordinator_tcp.protocol import (
    Challenge,
    ErrorReply,
    ResyncAddresses,
    StateUpdate,
    WarmupWitness,
    Welcome,
    WitnessModel,
    WitnessSubmit,
    decode_server_message,
    encode,
)
from coordinator_tcp.state_delta import StateMirror
from psyche_common.identity import Identity
from psyche_common.tcp.framing import encode_frame
from psyche_common.tcp.messages import signed_join

_SENT_AT = re.compile(rb'"sent_at":([0-9.eE+-]+)')
_SEQ = re.compile(rb'"state_seq":([0-9]+)')
RUN_ID = "bench-server-load"
MAX_FRAME = 1 << 26


def source_address(i: int) -> str:
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


class StateCache:
    """Each broadcast decoded once for all simulated clients (each real client would do
    it on its own machine; here N clients share one process, and N decodes and N
    elections per broadcast would measure this process, not the server). Broadcasts
    come as patches from the previous one: the cache keeps one copy of the state, fed
    by the first client to read each broadcast (which has read the one before)."""

    KEPT = 16  # recent states kept: clients read the same broadcasts at different times

    def __init__(self) -> None:
        self.mirror = StateMirror()
        self.by_seq: dict[int, CoordinatorState] = {}
        self._proofs: dict[int, dict[int, WitnessProof]] = {}
        self._indices: dict[int, dict[bytes, int]] = {}

    def state(self, seq: int, frame: bytes) -> tuple[CoordinatorState | None, bool]:
        """(the state broadcast `seq`, or None; True when the copy has a gap and the
        whole state must be asked for)."""
        if seq in self.by_seq:
            return self.by_seq[seq], False
        message = decode_server_message(frame)
        assert isinstance(message, StateUpdate)
        if self.mirror.seq is not None and seq <= self.mirror.seq:
            # An older broadcast read late by a slower client: not a gap of the copy.
            return (decode_state(message.state_bytes) if message.state else None), False
        data, ask = self.mirror.apply(message)
        if data is None:
            return None, ask
        self.by_seq[seq] = decode_state(data)
        for table in (self.by_seq, self._proofs, self._indices):
            for old in [s for s in table if s <= seq - self.KEPT]:
                del table[old]
        return self.by_seq[seq], False

    def witness_proof(self, seq: int, index: int) -> WitnessProof | None:
        """The round's witness proof of `index`, or None when it is not a witness."""
        if seq not in self._proofs:
            selection = selection_for_round(self.by_seq[seq])
            self._proofs[seq] = {i: selection.witness_of(i)
                                 for i in selection.witness_indices()}
        return self._proofs[seq].get(index)

    def index_of(self, seq: int, state: CoordinatorState, key: bytes) -> int | None:
        """A client's index in broadcast `seq`'s epoch (one table per state for all the
        clients of this process, as each real client looks up only itself)."""
        if seq not in self.by_seq:  # an older broadcast read late
            return next((i for i, c in enumerate(state.epoch_state.clients)
                         if c.id.key == key), None)
        if seq not in self._indices:
            self._indices[seq] = {c.id.key: i for i, c in enumerate(state.epoch_state.clients)}
        return self._indices[seq].get(key)


@dataclass
class Measure:
    measuring: bool = False
    latencies: list[float] = field(default_factory=list)
    bytes_received: int = 0
    broadcasts: set[int] = field(default_factory=set)
    busy: int = 0
    joined: int = 0
    whole_states: int = 0  # states received whole while measuring (answers to resyncs)


class SimulatedClient(asyncio.Protocol):
    def __init__(self, i: int, cache: StateCache, measure: Measure) -> None:
        self.identity = Identity((i + 1).to_bytes(32, "big"))
        self.key = self.identity.public_key  # derived once: it costs ~20 us each time
        self.name = f"sim-{i}"
        self.cache, self.measure = cache, measure
        self.joined: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.acted: set[tuple[str, int]] = set()
        self.error: BaseException | None = None  # what broke this client after it joined

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.joined.done():
            self.joined.set_exception(ConnectionError(f"closed while joining: {exc}"))

    def send(self, message: Any) -> None:
        assert self.transport is not None
        self.transport.write(encode_frame(encode(message)))

    def data_received(self, data: bytes) -> None:
        received = time.time()
        buffer = self.buffer
        buffer += data
        while len(buffer) >= 4:  # every frame: a 4-byte big-endian length, then the body
            length = int.from_bytes(buffer[:4], "big")
            if length > MAX_FRAME:
                self._fail(ValueError(f"frame of {length} bytes"))
                return
            if len(buffer) < 4 + length:
                return
            frame = bytes(buffer[4:4 + length])
            del buffer[:4 + length]
            try:
                self._frame(frame, received)
            except Exception as exc:  # reported by the process, never lost in a callback
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        if not self.joined.done():
            self.joined.set_exception(exc)
        else:
            self.error = exc
        if self.transport is not None:
            self.transport.close()

    def _frame(self, frame: bytes, received: float) -> None:
        if not self.joined.done():
            self._handshake(decode_server_message(frame))
            return
        sent_at, seq = _SENT_AT.search(frame), _SEQ.search(frame)
        if sent_at is None or seq is None or b'"type":"state"' not in frame:
            return  # a heartbeat, a notice
        number = int(seq.group(1))
        measure = self.measure
        if measure.measuring:
            measure.latencies.append(received - float(sent_at.group(1)))
            measure.bytes_received += len(frame) + 4
            measure.broadcasts.add(number)
            measure.whole_states += b'"state":"' in frame
        state, gap = self.cache.state(number, frame)
        if gap:
            self.send(ResyncAddresses())
        if state is not None:
            self._act(number, state)

    def _handshake(self, message: Any) -> None:
        if isinstance(message, ErrorReply):
            self.joined.set_exception(JoinRefused(message.error, message.detail))
        elif isinstance(message, Challenge):
            self.send(signed_join(self.identity, message.nonce, RUN_ID, self.name))
        elif isinstance(message, Welcome):
            self.joined.set_result(None)
        else:
            self.joined.set_exception(ValueError(f"unexpected {message.type!r} while joining"))

    def _act(self, number: int, state: CoordinatorState) -> None:
        """The witness a real client sends: the warm-up one (index 0) and each round's,
        when elected; once per phase and step."""
        index = self.cache.index_of(number, state, self.key)
        if index is None:
            return
        key = (state.run_state.name, state.progress.step)
        if key in self.acted:
            return
        if state.run_state is RunState.Warmup and index == 0:
            self.acted.add(key)  # warmup witness: {position=index, index, witness=false}
            proof = WitnessProof(position=index, index=index, witness=False)
            self.send(WarmupWitness(witness=WitnessModel.of(Witness(proof))))
        elif state.run_state is RunState.RoundTrain and number in self.cache.by_seq:
            self.acted.add(key)
            proof = self.cache.witness_proof(number, index)
            if proof is not None:
                self.send(WitnessSubmit(witness=WitnessModel.of(Witness(proof))))


async def join(i: int, port: int, cache: StateCache, measure: Measure) -> SimulatedClient:
    """Client `i` connected and joined (it retries after `Busy` or a refused connection)."""
    loop = asyncio.get_running_loop()
    for _attempt in range(200):
        client = SimulatedClient(i, cache, measure)
        try:
            await loop.create_connection(lambda c=client: c, "127.0.0.1", port,  # type: ignore[misc]  # the same protocol object back
                                         local_addr=(source_address(i), 0))
            await asyncio.wait_for(client.joined, 30)
            measure.joined += 1
            return client
        except JoinRefused as refused:
            if refused.error != "Busy":
                raise
            measure.busy += 1
        except (OSError, TimeoutError):
            pass
        if client.transport is not None:
            client.transport.close()
        await asyncio.sleep(0.2)
    raise RuntimeError(f"simulated client {i} could not join")


class Shared:
    """What the client processes and the measuring process share."""

    def __init__(self, context: Any) -> None:
        self.measuring = context.Event()
        self.done = context.Event()
        self.joined = context.Value("i", 0)
        self.active = context.Value("i", 0)  # some client saw the run training
        self.results = context.Queue()


def client_process(indices: range, port: int, shared: Shared) -> None:
    """One process's share of the simulated clients (as many processes as --client-processes:
    spread over cores, the clients measure the server rather than one Python process)."""
    os.nice(19)  # the server first, as on its own host
    asyncio.run(_client_process(indices, port, shared))


async def _client_process(indices: range, port: int, shared: Shared) -> None:
    cache, measure = StateCache(), Measure()
    joins = [asyncio.create_task(join(i, port, cache, measure)) for i in indices]
    clients: list[SimulatedClient] = []
    failures: list[BaseException] = []

    def joined(task: asyncio.Task[SimulatedClient]) -> None:
        if task.cancelled():
            return
        failure = task.exception()
        if failure is not None:
            failures.append(failure)
        else:
            clients.append(task.result())

    for task in joins:
        task.add_done_callback(joined)
    counted = 0
    error = None
    while not shared.done.is_set() and error is None:
        measure.measuring = shared.measuring.is_set()
        if measure.joined != counted:
            with shared.joined.get_lock():
                shared.joined.value += measure.joined - counted
            counted = measure.joined
        latest = cache.by_seq[max(cache.by_seq)] if cache.by_seq else None
        if latest is not None and latest.run_state.active:
            shared.active.value = 1
        failed = failures or [c.error for c in clients if c.error is not None]
        error = f"a simulated client failed: {failed[0]}" if failed else None
        await asyncio.sleep(0.05)
    for task in joins:
        task.cancel()
    await asyncio.gather(*joins, return_exceptions=True)
    for client in clients:  # every client leaves at once
        if client.transport is not None:
            client.transport.close()
    await asyncio.sleep(0.1)  # the closes go out
    shared.results.put({"error": error, "latencies": measure.latencies,
                        "bytes": measure.bytes_received, "broadcasts": sorted(measure.broadcasts),
                        "busy": measure.busy, "whole_states": measure.whole_states})
