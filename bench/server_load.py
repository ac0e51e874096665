"""Coordinator server load: many protocol-level clients on loopback against a real
`psyche-coordinator run`. Prints its figures, then ONE JSON line.

    .venv/bin/python bench/server_load.py [--counts 100,1000] [--duration 10]
                                          [--witnesses 8] [--client-processes 1]

For each N in --counts: N simulated clients (asyncio, no training, spread over
--client-processes processes), each on its own loopback source address (127.0.x.y, as
clients on their own hosts would be), all handshake at once (Challenge / signed Join), join the run and play it:
the elected client sends the warm-up witness and every round's elected witnesses send
their witness, so the coordinator keeps moving RoundTrain -> RoundWitness -> RoundTrain
and broadcasting (one broadcast per witness, as in a real run). The epoch takes the
first 256 (Psyche's cap); the others wait and still receive every state.

Per N, over --duration seconds once the run is training:
server_p50_ms_N, server_p99_ms_N
    latency of one broadcast to one client: the time the client read the frame minus
    `StateUpdate.sent_at` (stamped by the server when it encoded the broadcast; same
    host, same clock), over every (broadcast, client) pair. This includes the time the
    client's process spent on the frames of the clients before it (hundreds share a
    process here; a real client has its own host), so it is an upper bound: see
server_broadcast_p50_ms_N, server_broadcast_p99_ms_N
    the server's own time from a change of state to its last write of that broadcast
    to a client (its log line on stopping), over the broadcasts of the run: what the
    server adds, whatever the clients' processes do
bytes_per_client_per_tick_N
    bytes (frames with their 4-byte length) each client received per broadcast
server_cpu_ms_per_broadcast_N, server_rss_mb_N
    the server process's CPU time (user + system, /proc) per broadcast, and its
    resident memory at the end
join_s_N, busy_refusals_N
    from the first connection to all N joined; `Busy` refusals met on the way (each
    client retries after one)
whole_states_N
    states received whole while measuring (a client that missed a patch asks for the
    whole state): 0 when every patch follows
server_cpu_ms_all_leave_N
    the server's CPU time from the moment all N clients leave at once until 2 s after

With the clients on the same cores as the server (one process on this 2-core machine),
the latencies are an upper bound for a server with its own cores: a client process reads
its share of the N frames of each broadcast one after the other. The client processes
run at the lowest priority (nice 19), so that the server, when it has work, gets a core
as it would on a host of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coordinator import (  # noqa: E402
    CoordinatorState,
    RunState,
    Witness,
    WitnessProof,
    decode_state,
    selection_for_round,
)
from coordinator_tcp.client import JoinRefused, ProtocolConnection  # noqa: E402
from coordinator_tcp.protocol import (  # noqa: E402
    ResyncAddresses,
    StateUpdate,
    WarmupWitness,
    WitnessModel,
    WitnessSubmit,
    decode_server_message,
)
from coordinator_tcp.state_delta import StateMirror  # noqa: E402
from psyche_common.identity import Identity  # noqa: E402

_SENT_AT = re.compile(rb'"sent_at":([0-9.eE+-]+)')
_SEQ = re.compile(rb'"state_seq":([0-9]+)')
RUN_ID = "bench-server-load"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_state_toml(clients: int, witnesses: int, path: Path) -> None:
    import tomllib

    from coordinator.config import state_file_from_dict

    data = tomllib.loads((ROOT / "config" / "local-testnet" / "state.toml").read_text())
    data["run_id"] = RUN_ID
    data["config"].update({
        "init_min_clients": min(clients, 256), "min_clients": witnesses,
        "witness_nodes": witnesses,
        "warmup_time": 30, "epoch_time": 3600, "max_round_train_time": 5,
        "round_witness_time": 1, "cooldown_time": 1, "total_steps": 100000,
        "waiting_for_members_extra_time": 1})
    # The simulated clients read no data, but `run` refuses a location a real client cannot
    # read (coordinator/capabilities.py): a Local one needs no data server.
    data["model"]["LLM"]["data_location"] = {"Local": str(ROOT / "assets" / "data" / "train")}
    path.write_text(state_file_from_dict(data).to_toml())


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
        for old in [s for s in self.by_seq if s <= seq - self.KEPT]:
            del self.by_seq[old]
        return self.by_seq[seq], False

    def witness_proof(self, seq: int, index: int) -> WitnessProof | None:
        """The round's witness proof of `index`, or None when it is not a witness."""
        if seq not in self._proofs:
            selection = selection_for_round(self.by_seq[seq])
            self._proofs = {seq: {i: selection.witness_of(i)
                                  for i in selection.witness_indices()}}
        return self._proofs[seq].get(index)

    def index_of(self, seq: int, state: CoordinatorState, key: bytes) -> int | None:
        """A client's index in broadcast `seq`'s epoch (one table per state for all the
        clients of this process, as each real client looks up only itself)."""
        if seq not in self.by_seq:  # an older broadcast read late
            return next((i for i, c in enumerate(state.epoch_state.clients)
                         if c.id.key == key), None)
        if seq not in self._indices:
            self._indices = {seq: {c.id.key: i for i, c in enumerate(state.epoch_state.clients)}}
        return self._indices[seq].get(key)

    def resyncs_asked(self) -> int:
        return self.mirror.gaps


@dataclass
class Measure:
    measuring: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    latencies: list[float] = field(default_factory=list)
    bytes_received: int = 0
    broadcasts: set[int] = field(default_factory=set)
    busy: int = 0
    joined: int = 0
    whole_states: int = 0  # states received whole while measuring (answers to resyncs)


def source_address(i: int) -> str:
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


async def simulated_client(i: int, port: int, cache: StateCache, measure: Measure) -> None:
    identity = Identity((i + 1).to_bytes(32, "big"))
    for _attempt in range(200):
        try:
            connection, _ = await ProtocolConnection.connect(
                "127.0.0.1", port, identity, RUN_ID, f"sim-{i}", timeout_s=30,
                local_addr=(source_address(i), 0))
            break
        except JoinRefused as refused:
            if refused.error != "Busy":
                raise
            measure.busy += 1
            await asyncio.sleep(0.2)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.2)
    else:
        raise RuntimeError(f"simulated client {i} could not join")
    measure.joined += 1
    acted: set[tuple[str, int]] = set()
    try:
        while not measure.done.is_set():
            try:  # asyncio.timeout: no task per frame, as wait_for would make
                async with asyncio.timeout(1.0):
                    header = await connection.reader.readexactly(4)
            except TimeoutError:
                continue
            # The body outside the timeout: cut off between the two, the next read would
            # take the body for a header.
            frame = await connection.reader.readexactly(int.from_bytes(header, "big"))
            received = time.time()
            sent_at, seq = _SENT_AT.search(frame), _SEQ.search(frame)
            if sent_at is None or seq is None or b'"type":"state"' not in frame:
                continue
            number = int(seq.group(1))
            if measure.measuring.is_set():
                measure.latencies.append(received - float(sent_at.group(1)))
                measure.bytes_received += len(frame) + 4
                measure.broadcasts.add(number)
                measure.whole_states += b'"state":"' in frame
            state, gap = cache.state(number, frame)
            if gap:
                await connection.send(ResyncAddresses())
            if state is None:
                continue
            index = cache.index_of(number, state, identity.public_key)
            if index is None:
                continue
            key = (state.run_state.name, state.progress.step)
            if key in acted:
                continue
            if state.run_state is RunState.Warmup and index == 0:
                acted.add(key)  # warmup witness: {position=index, index, witness=false}
                proof = WitnessProof(position=index, index=index, witness=False)
                await connection.send(WarmupWitness(witness=WitnessModel.of(Witness(proof))))
            elif state.run_state is RunState.RoundTrain and number in cache.by_seq:
                proof = cache.witness_proof(number, index)
                acted.add(key)
                if proof is not None:
                    await connection.send(WitnessSubmit(witness=WitnessModel.of(Witness(proof))))
    finally:
        await connection.close()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


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
    tasks = [asyncio.create_task(simulated_client(i, port, cache, measure)) for i in indices]
    counted = 0
    error = None
    while not shared.done.is_set() and error is None:
        if shared.measuring.is_set() != measure.measuring.is_set():
            (measure.measuring.set if shared.measuring.is_set() else measure.measuring.clear)()
        if measure.joined != counted:
            with shared.joined.get_lock():
                shared.joined.value += measure.joined - counted
            counted = measure.joined
        latest = cache.by_seq[max(cache.by_seq)] if cache.by_seq else None
        if latest is not None and latest.run_state.active:
            shared.active.value = 1
        failed = [task.exception() for task in tasks if task.done() and task.exception()]
        error = f"a simulated client failed: {failed[0]}" if failed else None
        await asyncio.sleep(0.01)
    measure.done.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    shared.results.put({"error": error, "latencies": measure.latencies,
                        "bytes": measure.bytes_received, "broadcasts": sorted(measure.broadcasts),
                        "busy": measure.busy, "whole_states": measure.whole_states})


async def measure_count(clients: int, duration_s: float, witnesses: int,
                        processes: int = 1) -> dict[str, Any]:
    port = free_port()
    context = multiprocessing.get_context("spawn")
    shared = Shared(context)
    share = -(-clients // processes)
    workers = [context.Process(target=client_process, daemon=True,
                               args=(range(i, min(clients, i + share)), port, shared))
               for i in range(0, clients, share)]
    with tempfile.TemporaryDirectory() as tmp:
        state_path = Path(tmp) / "state.toml"
        bench_state_toml(clients, witnesses, state_path)
        server_log = Path(tmp) / "server.log"
        server = subprocess.Popen(
            [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state_path),
             "--server-port", str(port), "--bind-host", "127.0.0.1", "--tick-interval", "0.1"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=server_log.open("wb"))
        rows: list[dict[str, Any]] = []
        try:
            for _ in range(100):  # the server's port opens
                with contextlib.suppress(OSError):
                    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                await asyncio.sleep(0.1)
            began = time.monotonic()
            for worker in workers:
                worker.start()
            deadline = began + 180
            join_s = None
            while time.monotonic() < deadline:
                if join_s is None and shared.joined.value == clients:
                    join_s = time.monotonic() - began
                if join_s is not None and shared.active.value:
                    break
                if any(not worker.is_alive() for worker in workers) or not shared.results.empty():
                    raise RuntimeError(f"a client process ended early: {_first_error(shared)}")
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"{clients} clients: the run never started "
                                   f"({shared.joined.value} joined)")
            cpu_before = _cpu_seconds(server.pid)
            shared.measuring.set()
            await asyncio.sleep(duration_s)
            shared.measuring.clear()
            cpu = _cpu_seconds(server.pid) - cpu_before
            rss = _rss_mb(server.pid)
            shared.done.set()  # every client leaves at once
            cpu_at_done = _cpu_seconds(server.pid)
            rows = [await asyncio.to_thread(shared.results.get, True, 60) for _ in workers]
            await asyncio.sleep(2.0)  # the server sees every connection close
            leave_cpu = _cpu_seconds(server.pid) - cpu_at_done
        finally:
            shared.done.set()
            for worker in workers:
                worker.join(10)
                if worker.is_alive():
                    worker.kill()
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(10)
            if server.poll() is None:
                server.kill()
        broadcast_ms = _server_broadcast_ms(server_log.read_text(errors="replace"))
    errors = [row["error"] for row in rows if row["error"]]
    if errors:
        raise RuntimeError(errors[0])
    ordered = sorted(latency for row in rows for latency in row["latencies"])
    broadcasts = len({seq for row in rows for seq in row["broadcasts"]})
    if not ordered or not broadcasts:
        raise RuntimeError(f"{clients} clients: no broadcasts measured")
    return {
        "clients": clients, "client_processes": len(workers), "samples": len(ordered),
        "broadcasts": broadcasts,
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 2),
        "server_broadcast_p50_ms": broadcast_ms[0], "server_broadcast_p99_ms": broadcast_ms[1],
        "bytes_per_client_per_tick": round(
            sum(row["bytes"] for row in rows) / clients / broadcasts, 1),
        "server_cpu_ms_per_broadcast": round(cpu * 1000 / broadcasts, 2),
        "server_rss_mb": round(rss, 1), "join_s": round(join_s or 0.0, 2),
        "busy_refusals": sum(row["busy"] for row in rows),
        "server_cpu_ms_all_leave": round(leave_cpu * 1000, 1),
        "whole_states": sum(row["whole_states"] for row in rows),
    }


_BROADCAST_MS = re.compile(r"each written to every client in p50 ([0-9.]+) ms, p99 ([0-9.]+) ms")


def _server_broadcast_ms(log_text: str) -> tuple[float, float]:
    """(p50, p99) from the server's log line on stopping."""
    found = _BROADCAST_MS.search(log_text)
    if found is None:
        raise RuntimeError("the server's log has no broadcast timing line: "
                           f"{log_text.strip().splitlines()[-3:]}")
    return float(found.group(1)), float(found.group(2))


def _first_error(shared: Shared) -> str:
    with contextlib.suppress(Exception):
        return str(shared.results.get(timeout=1)["error"])
    return "no report"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="100,1000")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--witnesses", type=int, default=8)
    parser.add_argument("--client-processes", type=int, default=1,
                        help="processes the simulated clients are spread over (one per "
                             "spare core measures the server, not the clients)")
    args = parser.parse_args()
    if args.client_processes < 1:
        parser.error("--client-processes must be at least 1")
    counts = [int(c) for c in args.counts.split(",") if c]
    print(f"coordinator server load, simulated clients ({os.cpu_count()} CPUs):", flush=True)
    figures: dict[str, Any] = {}
    for count in counts:
        row = asyncio.run(measure_count(count, args.duration, args.witnesses,
                                        args.client_processes))
        print(f"  {count:4d} clients: {row['broadcasts']} broadcasts, p50 {row['p50_ms']} ms, "
              f"p99 {row['p99_ms']} ms (the server's part: p50 "
              f"{row['server_broadcast_p50_ms']} ms, p99 {row['server_broadcast_p99_ms']} ms), "
              f"{row['bytes_per_client_per_tick']} B/client/tick, "
              f"server {row['server_cpu_ms_per_broadcast']} ms CPU/broadcast, "
              f"{row['server_rss_mb']} MB RSS, joined in {row['join_s']} s "
              f"({row['busy_refusals']} Busy), {row['whole_states']} whole states received "
              f"while measuring; clients in {row['client_processes']} processes", flush=True)
        figures |= {f"server_p50_ms_{count}": row["p50_ms"],
                    f"server_p99_ms_{count}": row["p99_ms"],
                    f"server_broadcast_p50_ms_{count}": row["server_broadcast_p50_ms"],
                    f"server_broadcast_p99_ms_{count}": row["server_broadcast_p99_ms"],
                    f"bytes_per_client_per_tick_{count}": row["bytes_per_client_per_tick"],
                    f"server_cpu_ms_per_broadcast_{count}": row["server_cpu_ms_per_broadcast"],
                    f"server_rss_mb_{count}": row["server_rss_mb"],
                    f"join_s_{count}": row["join_s"],
                    f"busy_refusals_{count}": row["busy_refusals"],
                    f"whole_states_{count}": row["whole_states"],
                    f"client_processes_{count}": row["client_processes"],
                    f"server_cpu_ms_all_leave_{count}": row["server_cpu_ms_all_leave"]}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
