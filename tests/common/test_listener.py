"""psyche_common.tcp.listener: connections on loopback, each served by its own task;
close ends every one of them, and a handler that ignores its closed socket is cancelled
once close's timeout is over."""

from __future__ import annotations

import asyncio
import time

from psyche_common.tcp.listener import Listener


async def test_close_ends_every_connection_and_its_handler() -> None:
    ended: list[bytes] = []

    async def echo_until_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        writer.write(line)
        await reader.read()  # until the listener (or the client) closes the socket
        ended.append(line)

    listener = Listener(echo_until_eof, "127.0.0.1", 0)
    await listener.start()
    clients = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(3)]
    for index, (reader, writer) in enumerate(clients):
        writer.write(f"hello {index}\n".encode())
        assert await reader.readline() == f"hello {index}\n".encode()
    assert listener.connections == 3
    await listener.close()
    assert sorted(ended) == [b"hello 0\n", b"hello 1\n", b"hello 2\n"]
    assert listener.connections == 0
    for reader, _writer in clients:  # the server side closed each connection
        assert await asyncio.wait_for(reader.read(), 2) == b""
    for _reader, writer in clients:
        writer.close()


async def test_a_handler_that_ignores_its_closed_socket_is_not_waited_for_past_the_timeout(
) -> None:
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def stuck(_reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    listener = Listener(stuck, "127.0.0.1", 0)
    await listener.start()
    _reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    await asyncio.wait_for(entered.wait(), 2)
    began = time.monotonic()
    await listener.close(timeout_s=0.3)
    assert time.monotonic() - began < 2
    await asyncio.wait_for(cancelled.wait(), 2)
    assert listener.connections == 0
    writer.close()
