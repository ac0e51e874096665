"""Length-prefixed frames on iroh streams, shared by our protocols.

A frame is ``u32 big-endian length ‖ payload``. Readers always pass a limit,
so a peer can never make us allocate more than we agreed to read.
"""

from __future__ import annotations

import struct

import iroh

LENGTH_PREFIX = struct.Struct(">I")
READ_CHUNK = 1 << 20


class StreamClosed(ConnectionError):
    """The stream ended (cleanly or not) before the expected bytes arrived."""


class FrameTooLarge(ValueError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit}")
        self.size = size
        self.limit = limit


def encode_frame(payload: bytes) -> bytes:
    return LENGTH_PREFIX.pack(len(payload)) + payload


async def read_exact(recv: iroh.RecvStream, size: int) -> bytes:
    """Exactly ``size`` bytes; ``StreamClosed`` if the stream ends first."""
    parts: list[bytes] = []
    remaining = size
    while remaining:
        try:
            chunk = await recv.read(min(remaining, READ_CHUNK))
        except iroh.IrohError as error:
            raise StreamClosed(f"stream failed: {error}") from None
        if not chunk:
            raise StreamClosed(f"stream ended with {remaining} of {size} bytes missing")
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


async def read_frame_length(recv: iroh.RecvStream) -> int | None:
    """The next frame's length, or None at a clean end of stream between frames."""
    try:
        first = await recv.read(LENGTH_PREFIX.size)
    except iroh.IrohError as error:
        raise StreamClosed(f"stream failed: {error}") from None
    if not first:
        return None
    if len(first) < LENGTH_PREFIX.size:
        first += await read_exact(recv, LENGTH_PREFIX.size - len(first))
    (length,) = LENGTH_PREFIX.unpack(first)
    return int(length)


async def read_frame(recv: iroh.RecvStream, limit: int) -> bytes | None:
    """Next frame payload (None at clean end); ``FrameTooLarge`` before reading a big body."""
    length = await read_frame_length(recv)
    if length is None:
        return None
    if length > limit:
        raise FrameTooLarge(length, limit)
    return await read_exact(recv, length)


class FrameReader:
    """Reads frames through a buffer: one binding call returns many small frames.

    Gossip frames are small and frequent; two ``read`` calls per frame (prefix,
    body) made the binding's per-call cost dominate, so read up to
    ``read_size`` bytes at a time and cut frames out of the buffer.
    """

    def __init__(self, recv: iroh.RecvStream, read_size: int = 64 * 1024) -> None:
        self._recv = recv
        self._read_size = read_size
        self._buffer = bytearray()

    async def _fill(self, needed: int) -> bool:
        """Buffer at least ``needed`` bytes; False at a clean end with an empty buffer."""
        while len(self._buffer) < needed:
            try:
                chunk = await self._recv.read(self._read_size)
            except iroh.IrohError as error:
                raise StreamClosed(f"stream failed: {error}") from None
            if not chunk:
                if not self._buffer:
                    return False
                raise StreamClosed(
                    f"stream ended inside a frame ({len(self._buffer)} bytes buffered)"
                )
            self._buffer += chunk
        return True

    async def next_length(self) -> int | None:
        """Length of the next frame (its prefix consumed), None at a clean end."""
        if not await self._fill(LENGTH_PREFIX.size):
            return None
        (length,) = LENGTH_PREFIX.unpack_from(self._buffer)
        del self._buffer[: LENGTH_PREFIX.size]
        return int(length)

    async def body(self, length: int) -> bytes:
        if not await self._fill(length) and length:
            raise StreamClosed(f"stream ended before a {length}-byte frame body")
        body = bytes(self._buffer[:length])
        del self._buffer[:length]
        return body

    async def skip(self, length: int) -> None:
        remaining = length
        while remaining:
            step = min(remaining, READ_CHUNK)
            await self.body(step)
            remaining -= step


async def discard(recv: iroh.RecvStream, size: int) -> None:
    """Read and drop ``size`` bytes (to skip an oversized frame and stay in sync)."""
    remaining = size
    while remaining:
        remaining -= len(await read_exact(recv, min(remaining, READ_CHUNK)))
