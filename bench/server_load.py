"""Coordinator server load: many protocol-level clients on loopback against a real
`psyche-coordinator run`. Prints its figures, then ONE JSON line.

    .venv/bin/python -m bench.server_load [--counts 100,1000] [--duration 10]
                                          [--witnesses 8] [--client-processes 1]

For each N in --counts: N simulated clients (bench/simulated_clients.py: asyncio
protocols, no training, spread over --client-processes processes), each on its own
loopback source address (127.0.x.y, as clients on their own hosts would be), all
handshake at once (Challenge / signed Join), join the run and play it: the elected
client sends the warm-up witness and every round's elected witnesses send their
witness, so the coordinator keeps moving RoundTrain -> RoundWitness -> RoundTrain and
broadcasting (the witnesses that arrive together make one broadcast). The epoch takes
the first 256 (Psyche's cap); the others wait and still receive every state.

Per N, over --duration seconds once the run is training:
server_p50_ms_N, server_p99_ms_N
    latency of one broadcast to one client: the time the client's process read the
    frame's bytes minus `StateUpdate.sent_at` (stamped by the server when it encoded the
    broadcast; same host, same clock), over every (broadcast, client) pair. This
    includes the time that process spent reading the frames of the clients before it
    (hundreds share a process here; a real client has its own host): an upper bound.
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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.simulated_clients import RUN_ID, Shared, client_process

ROOT = Path(__file__).resolve().parents[1]


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_mb(pid: int, field: str) -> float:
    """A memory figure of /proc/PID/status (VmRSS, VmHWM) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.asynccontextmanager
async def coordinator_server(command: list[str], log: Path, port: int,
                             open_wait_s: float) -> AsyncIterator[subprocess.Popen[bytes]]:
    """The coordinator server `command` (a `coordinator_tcp run` on `port`) in a process
    of its own, its stderr to `log`, entered once its port opens (or `open_wait_s` has
    passed: the caller's own waits then say what went wrong); terminated on leaving,
    killed if it has not ended 10 s later."""
    with log.open("wb") as log_file:
        server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=log_file)
        try:
            for _ in range(round(open_wait_s / 0.1)):
                with contextlib.suppress(OSError):
                    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                await asyncio.sleep(0.1)
            yield server
        finally:
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(10)
            if server.poll() is None:
                server.kill()


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
        command = [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state_path),
                   "--server-port", str(port), "--bind-host", "127.0.0.1",
                   "--tick-interval", "0.1"]
        rows: list[dict[str, Any]] = []
        async with coordinator_server(command, server_log, port, open_wait_s=10) as server:
            try:
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
                    if (any(not worker.is_alive() for worker in workers)
                            or not shared.results.empty()):
                        raise RuntimeError(f"a client process ended early: {_first_error(shared)}")
                    await asyncio.sleep(0.1)
                else:
                    raise RuntimeError(f"{clients} clients: the run never started "
                                       f"({shared.joined.value} joined)")
                cpu_before = cpu_seconds(server.pid)
                shared.measuring.set()
                await asyncio.sleep(duration_s)
                shared.measuring.clear()
                cpu = cpu_seconds(server.pid) - cpu_before
                rss = status_mb(server.pid, "VmRSS")
                shared.done.set()  # every client leaves at once
                cpu_at_done = cpu_seconds(server.pid)
                rows = [await asyncio.to_thread(shared.results.get, True, 60) for _ in workers]
                await asyncio.sleep(2.0)  # the server sees every connection close
                leave_cpu = cpu_seconds(server.pid) - cpu_at_done
            finally:
                shared.done.set()
                for worker in workers:
                    worker.join(10)
                    if worker.is_alive():
                        worker.kill()
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
