"""End-to-end figures of the TCP backend. Prints its measurements, then ONE JSON line.

    .venv/bin/python bench/e2e.py [--counts 8,16,32,64,128,256,512] [--duration 8]
                                  [--skip-round-overhead]

max_clients_p99_100ms
    Protocol-level simulated clients, no training: a real `psyche-coordinator run`
    process on loopback, and N real TCP connections from this process that handshake
    (Challenge / signed Join), join the run and play it: the elected client sends the
    warmup witness and each round's witness (empty blooms are valid), so the coordinator
    keeps moving RoundTrain -> RoundWitness -> RoundTrain and broadcasting. Latency of
    one broadcast to one client = (time the frame was read by that client) -
    StateUpdate.sent_at (stamped by the server when it encoded the broadcast; same host,
    same clock). For each N in --counts (increasing) we report p50/p99/max over every
    (broadcast, client) pair; the figure is the largest N whose p99 < 100 ms (the sweep
    stops at the first N that fails). The clients share this machine with the server,
    so the figure is a lower bound for a server with its own cores.

round_overhead_ratio
    Wall time of a round over its pure compute time, 4 clients on CPU: see
    `measure_round_overhead_ratio` (runs `psyche-testnet` headless with 4 clients and
    reads the clients' `trained` events: `seconds` is the compute time of the step).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coordinator import (  # noqa: E402
    RunState,
    Witness,
    WitnessProof,
    decode_state,
    selection_for_round,
)
from coordinator.config import state_file_from_dict  # noqa: E402
from coordinator_tcp.client import ProtocolConnection  # noqa: E402
from coordinator_tcp.protocol import (  # noqa: E402
    StateUpdate,
    WarmupWitness,
    WitnessModel,
    WitnessSubmit,
    decode_server_message,
)
from psyche_common.identity import Identity  # noqa: E402
from psyche_common.tcp.framing import read_frame  # noqa: E402

_SENT_AT = re.compile(rb'"sent_at":([0-9.eE+-]+)')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_state_toml(clients: int, path: Path) -> None:
    data = tomllib.loads((ROOT / "config" / "local-testnet" / "state.toml").read_text())
    data["run_id"] = "bench-e2e"
    data["config"].update({
        "init_min_clients": min(clients, 256), "min_clients": 1, "witness_nodes": 1,
        "warmup_time": 30, "epoch_time": 3600, "max_round_train_time": 5,
        "round_witness_time": 1, "cooldown_time": 1, "total_steps": 100000,
        "waiting_for_members_extra_time": 1})
    # The simulated clients read no data, but `run` refuses a location a real client cannot
    # read (coordinator/capabilities.py): a Local one needs no data server.
    data["model"]["LLM"]["data_location"] = {"Local": str(ROOT / "assets" / "data" / "train")}
    path.write_text(state_file_from_dict(data).to_toml())


class StateCache:
    """Decode each distinct broadcast once for all simulated clients, and elect its
    witnesses once: each real client would do this on its own machine, but here N
    clients share one process and N elections per round would measure our CPU, not
    the server."""

    def __init__(self) -> None:
        self.by_sent_at: dict[bytes, Any] = {}
        self._proofs: dict[bytes, dict[int, WitnessProof]] = {}

    def state(self, sent_at: bytes, frame: bytes) -> Any:
        if sent_at not in self.by_sent_at:
            message = decode_server_message(frame)
            assert isinstance(message, StateUpdate)
            self.by_sent_at = {sent_at: decode_state(message.state_bytes)}
        return self.by_sent_at[sent_at]

    def witness_proof(self, sent_at: bytes, index: int) -> WitnessProof | None:
        """The round's witness proof of `index`, or None when it is not a witness."""
        if sent_at not in self._proofs:
            state = self.by_sent_at[sent_at]
            selection = selection_for_round(state)
            self._proofs = {sent_at: {i: selection.witness_of(i)
                                      for i in selection.witness_indices()}}
        return self._proofs[sent_at].get(index)


async def simulated_client(i: int, port: int, cache: StateCache, latencies: list[float],
                           measuring: asyncio.Event, done: asyncio.Event,
                           handshakes: asyncio.Semaphore) -> None:
    identity = Identity((i + 1).to_bytes(32, "big"))
    async with handshakes:
        for _attempt in range(50):
            try:
                connection, _ = await ProtocolConnection.connect(
                    "127.0.0.1", port, identity, "bench-e2e", f"sim-{i}", timeout_s=10)
                break
            except Exception:
                await asyncio.sleep(0.2)
        else:
            raise RuntimeError(f"simulated client {i} could not join")
    acted: set[tuple[str, int]] = set()
    try:
        while not done.is_set():
            try:
                frame = await asyncio.wait_for(read_frame(connection.reader, 1 << 26), 1.0)
            except TimeoutError:
                continue
            received = time.time()
            match = _SENT_AT.search(frame)
            if match is None or b'"type":"state"' not in frame:
                continue
            if measuring.is_set():
                latencies.append(received - float(match.group(1)))
            state = cache.state(match.group(1), frame)
            index = _index(state, identity.public_key)
            if index is None:
                continue
            key = (state.run_state.name, state.progress.step)
            if key in acted:
                continue
            if state.run_state is RunState.Warmup and index == 0:
                acted.add(key)  # warmup witness: {position=index, index, witness=false}
                proof = WitnessProof(position=index, index=index, witness=False)
                await connection.send(WarmupWitness(witness=WitnessModel.of(Witness(proof))))
            elif state.run_state is RunState.RoundTrain:
                proof = cache.witness_proof(match.group(1), index)
                acted.add(key)
                if proof is not None:
                    await connection.send(WitnessSubmit(witness=WitnessModel.of(Witness(proof))))
    finally:
        await connection.close()


def _index(state: Any, key: bytes) -> int | None:
    for index, client in enumerate(state.epoch_state.clients):
        if client.id.key == key:
            return index
    return None


async def measure_count(clients: int, duration_s: float) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.toml"
        bench_state_toml(clients, state)
        server = subprocess.Popen(
            [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state),
             "--server-port", str(port), "--bind-host", "127.0.0.1", "--tick-interval", "0.1"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cache, latencies = StateCache(), list[float]()
        measuring, done = asyncio.Event(), asyncio.Event()
        handshakes = asyncio.Semaphore(32)  # below the server's max concurrent handshakes
        try:
            tasks = [asyncio.create_task(simulated_client(i, port, cache, latencies, measuring,
                                                          done, handshakes))
                     for i in range(clients)]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                states = list(cache.by_sent_at.values())
                if states and states[0].run_state.active:
                    break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"{clients} clients: the run never started")
            measuring.set()
            await asyncio.sleep(duration_s)
            done.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(10)
            if server.poll() is None:
                server.kill()
    if not latencies:
        raise RuntimeError(f"{clients} clients: no broadcasts measured")
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"clients": clients, "samples": len(ordered),
            "p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(p99 * 1000, 2), "max_ms": round(ordered[-1] * 1000, 2)}


async def max_clients_p99_100ms(counts: list[int], duration_s: float) -> tuple[int, list[Any]]:
    best, rows = 0, []
    for count in counts:
        row = await measure_count(count, duration_s)
        rows.append(row)
        print(f"  {count:4d} clients: {row['samples']:6d} samples  p50 {row['p50_ms']:8.2f} ms"
              f"  p99 {row['p99_ms']:8.2f} ms  max {row['max_ms']:8.2f} ms", flush=True)
        if row["p99_ms"] >= 100:
            break
        best = count
    return best, rows


# ---------------------------------------------------------------------------------------
# round_overhead_ratio
# ---------------------------------------------------------------------------------------
def measure_round_overhead_ratio(timeout_s: float = 900) -> dict[str, Any]:
    """Wall time of a round over its pure compute time, 4 CPU clients (the local testnet).

    Runs `psyche-testnet --num-clients 4 --headless` on config/local-testnet (with
    init_min_clients raised to 4) and reads every client's `trained` events: `seconds`
    is the step's compute time (forward/backward + DisTrO compress). Round wall time =
    the time between consecutive steps' `trained` events of the same client (JSON log
    `time`). Ratio = median round wall time / median compute time. LEAD: revisit once
    the client logs a per-round wall time of its own.
    """
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config"
        config.mkdir()
        state = (ROOT / "config" / "local-testnet" / "state.toml").read_text()
        data_port = free_port()
        (config / "state.toml").write_text(
            state.replace("init_min_clients = 3", "init_min_clients = 4")
            .replace("127.0.0.1:20001", f"127.0.0.1:{data_port}"))
        data = (ROOT / "config" / "local-testnet" / "data.toml").read_text()
        (config / "data.toml").write_text(
            data.replace("../../assets/data/train", str(ROOT / "assets" / "data" / "train")))
        work = Path(tmp) / "work"
        result = subprocess.run(
            [sys.executable, "-m", "local_testnet", "--num-clients", "4",
             "--config-path", str(config), "--headless", "--work-dir", str(work),
             "--server-port", str(free_port()), "--timeout", str(timeout_s)],
            cwd=ROOT, capture_output=True, check=False, text=True, timeout=timeout_s + 120)
        compute, rounds = [], []
        for log in sorted(work.glob("client-*.log")):
            times = []
            for line in log.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if isinstance(event, dict) and event.get("event") == "trained":
                        compute.append(float(event["seconds"]))
                        times.append((int(event["step"]), float(event.get("time", 0))))
            times.sort()
            rounds += [b[1] - a[1] for a, b in itertools.pairwise(times)
                       if b[0] == a[0] + 1 and a[1] > 0]
        if not compute or not rounds:
            return {"round_overhead_ratio": None,
                    "error": f"no trained events (testnet: {result.stdout.strip()[-300:]})"}
        ratio = statistics.median(rounds) / statistics.median(compute)
        return {"round_overhead_ratio": round(ratio, 2),
                "median_round_s": round(statistics.median(rounds), 3),
                "median_compute_s": round(statistics.median(compute), 3),
                "testnet": result.stdout.strip().splitlines()[-1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="8,16,32,64,128,256,512")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--skip-round-overhead", action="store_true")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",") if c]
    print(f"state broadcast latency, simulated clients ({os.cpu_count()} CPUs):", flush=True)
    best, rows = asyncio.run(max_clients_p99_100ms(counts, args.duration))
    print(f"max_clients_p99_100ms = {best}")
    overhead: dict[str, Any] = {"round_overhead_ratio": None}
    if not args.skip_round_overhead:
        overhead = measure_round_overhead_ratio()
        print(f"round_overhead_ratio = {overhead.get('round_overhead_ratio')} {overhead}")
    print(json.dumps({"max_clients_p99_100ms": best, "broadcast_latency": rows, **overhead}))


if __name__ == "__main__":
    main()
