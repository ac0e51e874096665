"""The run-manager's observer of a TCP coordinator that speaks protocol 1 (an older
release): it says so at once instead of waiting out its timeout."""

from __future__ import annotations

import asyncio
import json

import pytest

from psyche_common.tcp.framing import encode_frame
from run_manager.sources.coordinator import CoordinatorUnavailable
from run_manager.sources.tcp_coordinator import TcpCoordinatorSource

pytestmark = pytest.mark.timeout(30)


async def test_a_protocol_1_coordinator_is_named_as_such() -> None:
    async def old_server(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(encode_frame(json.dumps(
            {"type": "challenge", "version": 1, "nonce": "00" * 32}).encode()))
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(old_server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    source = TcpCoordinatorSource(f"127.0.0.1:{port}", "run", wait_s=20, max_backoff_s=0.2)
    try:
        with pytest.raises(CoordinatorUnavailable, match="speaks another protocol: "
                           "unsupported protocol version 1"):
            await asyncio.wait_for(source.client_version(), 10)
    finally:
        await source.close()
        listener.close()
