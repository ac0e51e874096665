"""Length-prefixed frames on an asyncio stream.

Every frame is a 4-byte big-endian length followed by that many bytes, as in
Psyche's TCP framing (tokio's LengthDelimitedCodec). The reader enforces a
maximum frame size *before* reading the body, so a peer announcing a huge frame
costs us four bytes, not memory.
"""

from __future__ import annotations

import asyncio
import struct

# Psyche's server default: a client's messages are small (witness blooms, health checks).
SERVER_MAX_FRAME = 8 * 1024 * 1024
# Psyche's client default: the coordinator state broadcast can be larger.
CLIENT_MAX_FRAME = 64 * 1024 * 1024

_LENGTH = struct.Struct(">I")


class FrameError(Exception):
    """The peer sent something that is not a valid frame (too large, truncated)."""


async def read_frame(reader: asyncio.StreamReader, max_size: int) -> bytes:
    """Read one frame; raises FrameError on an oversized or truncated frame,
    asyncio.IncompleteReadError on a clean EOF before the header."""
    header = await reader.readexactly(_LENGTH.size)
    (length,) = _LENGTH.unpack(header)
    if length > max_size:
        raise FrameError(f"frame of {length} bytes exceeds the limit of {max_size} bytes")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(
            f"connection closed inside a frame ({len(exc.partial)} of {length} bytes)"
        ) from exc


def encode_frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


async def write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(encode_frame(payload))
    await writer.drain()
