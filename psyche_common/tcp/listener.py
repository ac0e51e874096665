"""A TCP listening socket and the connections it accepted, shared by the coordinator
server and the data server: each connection runs `handle(reader, writer)` as its own
task, and `close` stops listening, closes every connection and gives the handlers a
moment to see their closed sockets and return (a handler still running after it is
cancelled).

    listener = Listener(handle, "127.0.0.1", 0)
    await listener.start();  listener.port
    await listener.close()
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from psyche_common.tcp.admission import ACCEPT_BACKLOG

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Listener:
    def __init__(self, handle: Handler, host: str, port: int) -> None:
        self.handle = handle
        self.host = host
        self.requested_port = port  # 0: any free port
        self._open: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        return len(self._open)

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._connection, self.host, self.requested_port, limit=2**16,
            backlog=ACCEPT_BACKLOG)

    async def close(self, timeout_s: float = 2.0) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._open.values():
            writer.close()
        if self._open:
            _done, running = await asyncio.wait(list(self._open), timeout=timeout_s)
            for task in running:
                task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout_s)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._open[task] = writer
        try:
            await self.handle(reader, writer)
        finally:
            del self._open[task]
            writer.close()
