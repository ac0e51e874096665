"""Idle connections held against a server from a process of their own, for the admission
test (tests/coordinator_tcp/test_join_under_load.py) and bench/join_under_load.py.

`per_address` connections from each of `addresses` loopback source addresses (any
127.0.0.0/8 address is the loopback on Linux), each saying nothing after connecting, or
the first two bytes of a frame header (every other address), and kept open: one the
server closes (shed, refused, past its handshake deadline) is opened again after
`reopen_after_s`, as an attacker keeping its hold would. Plain non-blocking sockets on
one epoll, no asyncio: a Python process keeps ten thousand open however often the server
closes them, so what is measured is the server.

    idle = IdleConnections(port, idle_addresses(200), per_address=10)
    idle.start()             # a process of its own; its descriptor limit raised to the hard one
    await idle.wait_opened(60)   # each connection made once
    idle.open_now, idle.challenged_now, idle.closed_by_server, idle.connect_failures
    idle.stop()
"""

from __future__ import annotations

import asyncio
import errno
import multiprocessing
import select
import socket
import time
from collections import deque
from typing import Any

IP_BIND_ADDRESS_NO_PORT = 24  # Linux: the source port is picked at connect, per destination
OPEN_PER_TURN = 500  # new connects per turn of the holder's loop (the server's backlog is 4096)


def idle_addresses(count: int, first_octet: int = 3) -> list[str]:
    """`count` loopback addresses 127.<first_octet>.x.y, apart from 127.0.0.1."""
    return [f"127.{first_octet}.{i // 250}.{1 + i % 250}" for i in range(count)]


class IdleConnections:
    def __init__(self, port: int, addresses: list[str], per_address: int,
                 reopen_after_s: float = 0.5, host: str = "127.0.0.1") -> None:
        self.args = (host, port, addresses, per_address, reopen_after_s)
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._opened = context.Event()
        # open now, closed by the server, failed connects, open and challenged
        self._counts = context.Array("q", 4)
        self._process = context.Process(target=_hold, daemon=True, args=(
            *self.args, self._counts, self._opened, self._stop))

    @property
    def wanted(self) -> int:
        return len(self.args[2]) * self.args[3]

    @property
    def open_now(self) -> int:
        return int(self._counts[0])

    @property
    def closed_by_server(self) -> int:
        return int(self._counts[1])

    @property
    def connect_failures(self) -> int:
        return int(self._counts[2])

    @property
    def challenged_now(self) -> int:
        """Open connections the server has sent something (its Challenge): accepted, not
        just waiting in its accept queue."""
        return int(self._counts[3])

    def start(self) -> None:
        self._process.start()

    async def wait_opened(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._opened.is_set():
            if not self._process.is_alive():
                raise RuntimeError(f"the idle connections' process ended "
                                   f"(exit code {self._process.exitcode})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.wanted} idle connections not opened in "
                                   f"{timeout_s} s ({self.open_now} open)")
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._process.pid is not None:
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)


def _hold(host: str, port: int, addresses: list[str], per_address: int,
          reopen_after_s: float, counts: Any, opened: Any, stop: Any) -> None:
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    holder = _Holder(host, port, reopen_after_s)
    queue = deque((address, index % 2 == 1) for index, address in enumerate(addresses)
                  for _ in range(per_address))
    while not stop.is_set():
        for _ in range(min(OPEN_PER_TURN, len(queue))):
            holder.open(*queue.popleft())
        holder.turn(0.02)
        counts[0], counts[1], counts[2] = holder.open_now, holder.closed, holder.failures
        counts[3] = holder.challenged
        if not queue and not opened.is_set():
            opened.set()
        queue.extend(holder.due())
    holder.close_all()


class _Holder:
    """The sockets and the epoll of the holding process."""

    def __init__(self, host: str, port: int, reopen_after_s: float) -> None:
        self.target = (host, port)
        self.reopen_after_s = reopen_after_s
        self.epoll = select.epoll()
        # fd -> (socket, source address, sends half a header, connected yet, challenged yet)
        self.sockets: dict[int, list[Any]] = {}
        self.later: deque[tuple[float, str, bool]] = deque()  # (when, address, partial)
        self.open_now = 0
        self.challenged = 0
        self.closed = 0
        self.failures = 0

    def open(self, address: str, partial: bool) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((address, 0))
            code = sock.connect_ex(self.target)
        except OSError:
            code = errno.EADDRNOTAVAIL
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.failures += 1
            self.later.append((time.monotonic() + self.reopen_after_s, address, partial))
            return
        self.sockets[sock.fileno()] = [sock, address, partial, False, False]
        self.epoll.register(sock.fileno(), select.EPOLLOUT | select.EPOLLIN | select.EPOLLRDHUP)

    def turn(self, timeout_s: float) -> None:
        for fd, events in self.epoll.poll(timeout_s):
            entry = self.sockets.get(fd)
            if entry is None:
                continue
            sock, _address, partial, connected, _challenged = entry
            if not connected and events & select.EPOLLOUT:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self._lost(fd, counted=False)
                    self.failures += 1
                    continue
                entry[3] = True
                self.open_now += 1
                self.epoll.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)
                if partial:
                    sock.send(b"\x00\x00")  # half a frame header, never finished
            if events & (select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLERR | select.EPOLLHUP):
                try:
                    data = sock.recv(65536)  # the Challenge (never answered), or the end
                except OSError:
                    data = b""
                if not data or events & (select.EPOLLRDHUP | select.EPOLLERR | select.EPOLLHUP):
                    self._lost(fd, counted=entry[3])
                    self.closed += entry[3]
                elif not entry[4]:
                    entry[4] = True
                    self.challenged += 1

    def _lost(self, fd: int, counted: bool) -> None:
        sock, address, partial, _connected, challenged = self.sockets.pop(fd)
        self.epoll.unregister(fd)
        sock.close()
        self.open_now -= counted
        self.challenged -= challenged
        self.later.append((time.monotonic() + self.reopen_after_s, address, partial))

    def due(self) -> list[tuple[str, bool]]:
        now = time.monotonic()
        ready = []
        while self.later and self.later[0][0] <= now:
            _when, address, partial = self.later.popleft()
            ready.append((address, partial))
        return ready

    def close_all(self) -> None:
        for sock, *_rest in self.sockets.values():
            sock.close()
        self.sockets.clear()
        self.epoll.close()
