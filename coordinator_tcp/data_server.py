"""The TCP data server: serves `data.toml`'s token files to the clients of the current epoch.

    server = DataServer(load_data_config("data.toml"), run_id, members=lambda: keys,
                        DataServerOptions(host="127.0.0.1", port=20001))
    await server.start(); ...; await server.stop()

The samples are exactly `LocalDataProvider(dir, seq_len, token_size, Seeded(shuffle_seed))`'s
(the server always shuffles, as Psyche's does), so data index n means the same sample
for every client; `provider=` serves other samples instead (ServedSamples: labels too,
when it has them). `members()` returns the public keys allowed to fetch (the coordinator's
`epoch_state.clients`); anyone else is answered `NotInThisRound`. The protocol is in
`coordinator_tcp.data_protocol`; untrusted input is handled as in the coordinator server
(handshake timeout, cap on concurrent handshakes, size-limited frames, error + disconnect).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

import torch

from coordinator.config import DataServerConfig, SeededShuffle
from coordinator_tcp.data_protocol import (
    DataRejected,
    DataRequest,
    DataResponse,
    DataWelcome,
    RejectReason,
    decode_data_client_message,
    max_samples_per_request,
)
from coordinator_tcp.protocol import (
    ProtocolError,
    encode,
)
from psyche_common.tcp.admission import AcceptGate
from psyche_common.tcp.framing import SERVER_MAX_FRAME, FrameError, encode_frame, read_frame
from psyche_common.tcp.handshake import JoinRejected, accept_join, send_fatal
from psyche_common.tcp.listener import Listener
from psyche_common.token_files import DataProviderError, LocalDataProvider

log = logging.getLogger(__name__)


def data_problems(config: DataServerConfig, where: str) -> list[str]:
    """What keeps the data server from serving `config`'s directory (missing, empty, a
    truncated token file, too short for one sample), as `where: dir ...` lines."""
    try:
        LocalDataProvider(config.dir, config.seq_len, config.token_size)
    except DataProviderError as exc:
        return [f"{where}: dir: {exc}"]
    return []


class ServedSamples(Protocol):
    """What the server serves: data.toml's token files (LocalDataProvider) by default. A
    provider that also has `get_labelled(start, end) -> (inputs, labels | None)` (the
    client's Preprocessed parquet provider) has its labels sent with the tokens."""

    @property
    def num_sequences(self) -> int: ...

    def get_samples(self, start: int, end: int) -> torch.Tensor: ...


@dataclass
class DataServerOptions:
    host: str = "127.0.0.1"
    port: int = 20001
    handshake_timeout_s: float = 10.0  # as the coordinator server's (server_options.py)
    max_handshakes: int = 1024
    max_handshakes_per_address: int = 8
    # Requests are tiny; a client frame bigger than this is garbage.
    max_request_frame: int = min(SERVER_MAX_FRAME, 64 * 1024)


class DataServer:
    def __init__(self, config: DataServerConfig, run_id: str,
                 members: Callable[[], Collection[bytes]],
                 options: DataServerOptions | None = None,
                 provider: ServedSamples | None = None):
        self.config = config
        self.run_id = run_id
        self.members = members
        self.options = options or DataServerOptions()
        self.provider: ServedSamples = provider or LocalDataProvider(
            config.dir, config.seq_len, config.token_size, SeededShuffle(seed=config.shuffle_seed))
        self._get_labelled = getattr(self.provider, "get_labelled", None)
        self.max_samples = max_samples_per_request(config.seq_len,
                                                   labelled=self._get_labelled is not None)
        self.samples_served: Counter[str] = Counter()  # hex key -> samples sent
        self.rejections = 0
        self.protocol_errors = 0
        self._gate = AcceptGate(self.options.max_handshakes,
                                self.options.max_handshakes_per_address,
                                self.options.handshake_timeout_s,
                                self._handshake_refused)
        self._listener = Listener(self._handle_connection, self.options.host, self.options.port)

    @property
    def num_sequences(self) -> int:
        return self.provider.num_sequences

    @property
    def port(self) -> int:
        return self._listener.port

    async def start(self) -> None:
        await self._listener.start()
        log.info("data server: %d samples of %d tokens from %s on %s:%d", self.num_sequences,
                 self.config.seq_len, self.config.dir, self.options.host, self.port)

    async def stop(self) -> None:
        await self._listener.close()

    async def __aenter__(self) -> DataServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ connections
    async def _handle_connection(self, reader: asyncio.StreamReader,
                                 writer: asyncio.StreamWriter) -> None:
        try:
            identity = await self._gate.admit(writer, lambda: self._handshake(reader, writer))
            if identity is not None:
                await self._serve(identity, reader, writer)
        except Exception:  # never let one connection take the server down
            log.exception("data server connection failed")

    def _handshake_refused(self, error: str, _cause: BaseException | None) -> None:
        if error == "HandshakeFailed":
            self.protocol_errors += 1

    async def _fail(self, writer: asyncio.StreamWriter, error: str, detail: str) -> None:
        await send_fatal(writer, error, detail)

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> bytes | None:
        try:
            message = await accept_join(reader, writer, run_id=self.run_id,
                                        decode=decode_data_client_message,
                                        max_frame=self.options.max_request_frame,
                                        serving="data server serves")
        except JoinRejected as rejected:
            await self._fail(writer, rejected.error, rejected.detail)
            return None
        writer.write(encode_frame(encode(DataWelcome(num_sequences=self.num_sequences,
                                                     seq_len=self.config.seq_len))))
        await writer.drain()
        return message.identity

    async def _serve(self, identity: bytes, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                message = decode_data_client_message(
                    await read_frame(reader, self.options.max_request_frame))
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            except (FrameError, ProtocolError) as exc:
                self.protocol_errors += 1
                await self._fail(writer, "ProtocolError", str(exc))
                return
            if not isinstance(message, DataRequest):
                self.protocol_errors += 1
                await self._fail(writer, "ProtocolError",
                                 f"expected a data request, got {message.type!r}")
                return
            reply = await self._answer(identity, message)
            writer.write(encode_frame(encode(reply)))
            await writer.drain()

    async def _answer(self, identity: bytes,
                      request: DataRequest) -> DataResponse | DataRejected:
        start, end = request.start, request.end

        def reject(reason: RejectReason, detail: str) -> DataRejected:
            self.rejections += 1
            return DataRejected(start=start, end=end, reason=reason, detail=detail)

        if identity not in set(self.members()):
            return reject("NotInThisRound",
                          f"{identity.hex()[:16]}… is not a client of the current epoch")
        if end >= start and end - start + 1 > self.max_samples:
            return reject("TooLarge", f"at most {self.max_samples} samples per request")
        try:
            if self._get_labelled is None:
                samples, labels = await asyncio.to_thread(self.provider.get_samples, start, end), None
            else:
                samples, labels = await asyncio.to_thread(self._get_labelled, start, end)
        except DataProviderError as exc:
            return reject("OutOfRange", str(exc))
        self.samples_served[identity.hex()] += samples.shape[0]
        return DataResponse.of(start, end, samples, labels)
