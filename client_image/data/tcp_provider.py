"""Data provider for the coordinator's TCP data server (run config `data_location = {Server = "host:port"}`).

    provider = await TcpDataProvider.open("127.0.0.1:20001", identity, run_id, max_seq_len)
    batch = await provider.fetch(start, end)     # int64 [end - start + 1, max_seq_len]
    batch, labels = await provider.fetch_labelled(start, end)   # labels None if not served
    await provider.aclose()

The connection authenticates with the client's node identity (Challenge/Join, see
`coordinator_tcp.data_protocol`); the server only answers clients of the current epoch.
A failed fetch (rejection, dropped connection, timeout) is retried as Psyche does: 7
attempts, waiting `retry_delay_s * (attempt - 1)` before attempt `attempt` (0 s, 2 s,
4 s, ... with the default 2 s), reconnecting when the connection is gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypedDict, TypeVar, Unpack

import torch

from coordinator_tcp.data_protocol import (
    DataRejected,
    DataRequest,
    DataResponse,
    DataWelcome,
    decode_data_server_message,
)
from psyche_common.identity import Identity
from psyche_common.tcp.connection import (
    CONNECTION_ERRORS,
    Connection,
    JoinRefused,
    parse_host_port,
)
from psyche_common.tcp.messages import PERMANENT_JOIN_ERRORS, ErrorReply, ProtocolError
from psyche_common.token_files.sequences import DataProviderError

log = logging.getLogger(__name__)

FETCH_ATTEMPTS = 7
RETRY_DELAY_S = 2.0
T = TypeVar("T")
_RETRIED: tuple[type[BaseException], ...] = (DataProviderError, *CONNECTION_ERRORS)


class DataServerMismatch(DataProviderError):
    """The data server is for another run or serves another sequence length: not retried."""


class _RetryOptions(TypedDict, total=False):
    """The keyword arguments `TcpDataProvider.open` passes on to the constructor."""

    attempts: int
    retry_delay_s: float
    timeout_s: float


class TcpDataProvider:
    def __init__(self, address: str, identity: Identity, run_id: str, max_seq_len: int, *,
                 attempts: int = FETCH_ATTEMPTS, retry_delay_s: float = RETRY_DELAY_S,
                 timeout_s: float = 30.0):
        try:
            self.host, self.port = parse_host_port(address, "the data server address")
        except ValueError as exc:
            raise DataProviderError(str(exc)) from None
        self.identity = identity
        self.run_id = run_id
        self.max_seq_len = max_seq_len
        self.attempts = attempts
        self.retry_delay_s = retry_delay_s
        self.timeout_s = timeout_s
        self._connection: Connection | None = None
        self._num_sequences = 0
        self._lock = asyncio.Lock()  # one request in flight per connection

    @classmethod
    async def open(cls, address: str, identity: Identity, run_id: str, max_seq_len: int,
                   **options: Unpack[_RetryOptions]) -> TcpDataProvider:
        """Connect (with the same retries as fetch) and learn the data set's size."""
        provider = cls(address, identity, run_id, max_seq_len, **options)
        await provider._with_retries("connect", provider._ensure_connected)
        return provider

    @property
    def num_sequences(self) -> int:
        return self._num_sequences

    async def fetch(self, start: int, end: int) -> torch.Tensor:
        return (await self.fetch_labelled(start, end))[0]

    async def fetch_labelled(self, start: int,
                             end: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The samples and their labels (None when the server sends none)."""
        async def attempt() -> tuple[torch.Tensor, torch.Tensor | None]:
            return await self._request(start, end)

        return await self._with_retries(f"fetch [{start}, {end}]", attempt)

    async def aclose(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    # ------------------------------------------------------------------ internals
    async def _with_retries(self, what: str, action: Callable[[], Awaitable[T]]) -> T:
        last_error: BaseException | None = None
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                await asyncio.sleep(self.retry_delay_s * (attempt - 1))
            try:
                return await action()
            except DataServerMismatch:
                await self.aclose()
                raise
            except JoinRefused as exc:
                if exc.error in PERMANENT_JOIN_ERRORS:  # retrying cannot help
                    raise DataServerMismatch(f"data server refused the join: {exc}") from None
                last_error = exc
            except _RETRIED as exc:
                last_error = exc
                log.warning("data server %s:%d: %s failed (attempt %d/%d): %s", self.host,
                            self.port, what, attempt, self.attempts, exc)
                if not isinstance(exc, DataProviderError) or self._connection is None:
                    await self.aclose()
        raise DataProviderError(
            f"data server {self.host}:{self.port}: {what} failed after {self.attempts} "
            f"attempts: {last_error}")

    async def _ensure_connected(self) -> Connection:
        if self._connection is not None:
            return self._connection
        connection, welcome = await Connection.connect(
            self.host, self.port, self.identity, self.run_id, timeout_s=self.timeout_s,
            decode=decode_data_server_message, expect_welcome=DataWelcome)
        if welcome.seq_len != self.max_seq_len:
            await connection.close()
            raise DataServerMismatch(
                f"the data server serves samples of {welcome.seq_len} tokens but the run's "
                f"max_seq_len is {self.max_seq_len}")
        self._connection, self._num_sequences = connection, welcome.num_sequences
        return connection

    async def _request(self, start: int,
                       end: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        if start < 0 or end < start:
            raise ValueError(f"bad batch id [{start}, {end}]: need 0 <= start <= end")
        async with self._lock:
            connection = await self._ensure_connected()
            await connection.send(DataRequest(start=start, end=end))
            reply = await asyncio.wait_for(connection.receive(), self.timeout_s)
        if isinstance(reply, DataResponse):
            if (reply.start, reply.end) != (start, end):
                raise ProtocolError(f"asked for [{start}, {end}], got [{reply.start}, {reply.end}]")
            return reply.samples(self.max_seq_len), reply.sample_labels(self.max_seq_len)
        if isinstance(reply, DataRejected):
            raise DataProviderError(f"request [{start}, {end}] rejected: {reply.reason} "
                                    f"{reply.detail}".strip())
        if isinstance(reply, ErrorReply):
            await self.aclose()
            raise DataProviderError(f"data server error {reply.error}: {reply.detail}")
        raise ProtocolError(f"unexpected data server message {reply.type!r}")
