"""Honest joins while idle connections are held against the coordinator server (issue 32).
Prints its figures, then ONE JSON line.

    .venv/bin/python -m bench.join_under_load [--idle 10000] [--addresses 1000]
        [--joins 250] [--join-every 0.1] [--reopen-after 0.5] [--server-fd-limit N]

A real `psyche-coordinator run` in its own process; its handshake pool comes from its own
file-descriptor limit (half of it, after raising the soft limit to the hard one;
docs/tcp-admission.md); --server-fd-limit sets that limit. An attacker process holds --idle
connections from --addresses loopback source addresses (tests/idle_connections.py: half
of them send nothing, half the first two bytes of a frame header); each one the server
closes (shed for a newcomer, or past its handshake deadline) is opened again after
--reopen-after seconds, so the attacker keeps its hold as long as the bench runs. Once
every idle connection has been opened and the server has taken in as many as its pool
holds (its Challenge reached 99% of them), this process makes --joins honest joins, one
started every --join-every seconds whatever the others do (open-loop arrivals), each from
an address of its own (127.9.x.y) with a key of its own: the Challenge, the signed Join
and the Welcome (ProtocolConnection.connect, 30 s timeout), then it leaves. By default
the joins span 25 s, more than two of the server's handshake deadlines (10 s): each
deadline closes the idle connections that came together, and they come back together.

JSON fields:
idle_connections, idle_addresses
    the attacker's connections and source addresses
honest_joins_tried, honest_join_success_rate
    joins started, and the share welcomed (a `Busy`, another refusal or the timeout fails)
honest_join_p50_s, honest_join_p99_s, honest_join_max_s
    seconds from connect to Welcome, over the successful joins
server_rss_mb, server_rss_peak_mb
    the server process's resident memory at the end of the joins (VmRSS) and its peak (VmHWM)
server_handshake_pool, server_cpu_s
    the server's pool (its log line) and its CPU time (user + system) during the joins
idle_open_min, idle_open_median
    the attacker's connections open (connected, not closed by the server), sampled
    every 0.1 s during the joins: what the server held of them
idle_closed_by_server
    idle connections the server closed during the joins (each then reopened)
idle_opened_in_s, idle_held_in_s
    from the attacker's start to every connection made (the kernel's side), and to the
    server's Challenge on as many as its pool holds
fd_hard_limit
    RLIMIT_NOFILE's hard limit here (the server and the attacker raise their soft limit to it)

The attacker, the server and the joins share this machine's cores: on 2 shared cores the
attacker's reconnects take CPU from the server, so the figures are an upper bound for a
server with cores of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.server_load import coordinator_server, cpu_seconds, status_mb
from coordinator_tcp.client import JoinRefused, ProtocolConnection
from psyche_common.identity import Identity
from psyche_common.tcp.admission import raise_fd_limit
from tests.idle_connections import IdleConnections, idle_addresses
from tests.loopback import free_port
from tests.tcp_helpers import RUN_ID, make_state_file

ROOT = Path(__file__).resolve().parents[1]

_POOL_LINE = re.compile(r"admission: up to (\d+) connections in handshake")


async def honest_join(i: int, port: int) -> tuple[float | None, str]:
    """(seconds to the Welcome, or None; what went wrong)."""
    began = time.monotonic()
    try:
        connection, _welcome = await ProtocolConnection.connect(
            "127.0.0.1", port, Identity(((1 << 20) + i).to_bytes(32, "big")), RUN_ID, f"honest-{i}", local_addr=(f"127.9.{i // 250}.{1 + i % 250}", 0),
            timeout_s=30)
    except JoinRefused as refused:
        return None, refused.error
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
        return None, type(exc).__name__
    seconds = time.monotonic() - began
    await connection.close()
    return seconds, ""


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    per_address = -(-args.idle // args.addresses)
    half = args.addresses // 2
    attacker = IdleConnections(port, idle_addresses(half) + idle_addresses(
        args.addresses - half, first_octet=4), per_address, args.reopen_after)
    with tempfile.TemporaryDirectory() as tmp:
        state_path = Path(tmp) / "state.toml"
        # 256 clients to start: the honest joins only wait. A Local data location: the
        # server starts no data server (and loads no torch) for clients that read nothing.
        state_path.write_text(make_state_file(
            init_min_clients=256, min_clients=8,
            model={"data_location": {"Local": str(ROOT / "assets" / "data" / "train")}},
        ).to_toml())
        server_log = Path(tmp) / "server.log"
        command = [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state_path),
                   "--server-port", str(port), "--bind-host", "127.0.0.1"]
        if args.server_fd_limit is not None:  # its soft and hard limit, set by the shell
            command = ["/bin/sh", "-c", f'ulimit -n {args.server_fd_limit} && exec "$0" "$@"',
                       *command]
        async with coordinator_server(command, server_log, port, open_wait_s=20) as server:
            try:
                attacker.start()
                began = time.monotonic()
                await attacker.wait_opened(300)
                opened_s = time.monotonic() - began
                # The hold is in place once the server has taken in what its pool holds (the
                # rest wait in its accept queue): its Challenge reached that many.
                pool = await _pool_from_log(server_log)
                while attacker.challenged_now < 0.99 * min(args.idle, pool):
                    if time.monotonic() - began > 300:
                        raise RuntimeError(f"the server took in {attacker.challenged_now} idle "
                                           f"connections in 300 s (pool {pool})")
                    await asyncio.sleep(0.1)
                held_s = time.monotonic() - began
                closed_before = attacker.closed_by_server
                cpu_before = cpu_seconds(server.pid)
                samples: list[int] = []
                joins = []
                for i in range(args.joins):
                    joins.append(asyncio.create_task(honest_join(i, port)))
                    for _ in range(max(1, round(args.join_every / 0.1))):
                        samples.append(attacker.open_now)
                        await asyncio.sleep(min(0.1, args.join_every))
                results = await asyncio.gather(*joins)
                cpu = cpu_seconds(server.pid) - cpu_before
                rss, peak = status_mb(server.pid, "VmRSS"), status_mb(server.pid, "VmHWM")
                closed = attacker.closed_by_server - closed_before
                failures = attacker.connect_failures
            finally:
                attacker.stop()
    times = sorted(seconds for seconds, _error in results if seconds is not None)
    errors = sorted({error for seconds, error in results if seconds is None})
    return {
        "idle_connections": args.idle, "idle_addresses": args.addresses,
        "honest_joins_tried": len(results),
        "honest_join_success_rate": round(len(times) / len(results), 4),
        "honest_join_p50_s": round(statistics.median(times), 4) if times else None,
        "honest_join_p99_s": round(times[min(len(times) - 1, int(0.99 * len(times)))], 4)
        if times else None,
        "honest_join_max_s": round(times[-1], 4) if times else None,
        "honest_join_errors": errors,
        "server_rss_mb": round(rss, 1), "server_rss_peak_mb": round(peak, 1),
        "server_handshake_pool": pool,
        "server_cpu_s": round(cpu, 2),
        "idle_open_min": min(samples), "idle_open_median": int(statistics.median(samples)),
        "idle_closed_by_server": closed, "idle_connect_failures": failures, "idle_opened_in_s": round(opened_s, 2), "idle_held_in_s": round(held_s, 2),
        "reopen_after_s": args.reopen_after, "server_fd_limit": args.server_fd_limit,
        "fd_hard_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
    }


async def _pool_from_log(log: Path) -> int:
    """The handshake pool the server's log line says it has."""
    for _ in range(300):
        found = _POOL_LINE.search(log.read_text(errors="replace"))
        if found:
            return int(found.group(1))
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the server logged no admission line: {log.read_text()[-500:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=10000)
    parser.add_argument("--addresses", type=int, default=1000)
    parser.add_argument("--joins", type=int, default=250)
    parser.add_argument("--join-every", type=float, default=0.1)
    parser.add_argument("--reopen-after", type=float, default=0.5)
    parser.add_argument("--server-fd-limit", type=int, default=None,
                        help="the server's descriptor limit (its pool is half of it); "
                             "default: this process's hard limit")
    args = parser.parse_args()
    if args.idle < 1 or args.addresses < 2 or args.addresses > 250 * 250 or args.joins < 1:
        parser.error("--idle and --joins must be at least 1, --addresses 2 to 62500")
    limit = raise_fd_limit()
    if limit < args.idle + 512:
        parser.error(f"--idle {args.idle} needs {args.idle + 512} file descriptors in the "
                     f"attacker's process; the hard limit (ulimit -Hn) is {limit}")
    print(f"honest joins while {args.idle} idle connections from {args.addresses} addresses "
          f"are held ({os.cpu_count()} CPUs, fd limit {limit}):", flush=True)
    row = asyncio.run(measure(args))
    print(f"  {row['honest_joins_tried']} joins: {row['honest_join_success_rate']:.0%} in, "
          f"p50 {row['honest_join_p50_s']} s, p99 {row['honest_join_p99_s']} s, "
          f"max {row['honest_join_max_s']} s {row['honest_join_errors'] or ''}", flush=True)
    print(f"  server: pool {row['server_handshake_pool']}, {row['server_rss_mb']} MB RSS "
          f"(peak {row['server_rss_peak_mb']} MB), {row['server_cpu_s']} s CPU during the "
          f"joins; idle open min {row['idle_open_min']} median {row['idle_open_median']}, "
          f"{row['idle_closed_by_server']} closed by the server (and reopened) during the "
          f"joins; all opened in {row['idle_opened_in_s']} s, taken in by the server in "
          f"{row['idle_held_in_s']} s", flush=True)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
