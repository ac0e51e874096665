"""Model sharing for joiners on ALPN ``psyche/model-sharing/0``.

A sharing peer publishes each parameter as a blob (tag ``model-{name}``) and
answers a manifest request with the parameter names, shapes, dtypes, sizes and
BLAKE3 hashes plus the model's config and tokenizer JSON. A joiner fetches the
manifest from one source, then requests parameter ``i`` first from source
``i mod n`` (each tensor from a different peer in turn, the others as
fallbacks), verifies every tensor against its hash and size, and rebuilds a
state dict that is bit-identical to the peers'.

Request: frame ``{"v": 1, "kind": "manifest"}``; response: frame
``status (u8: 0 ok, 1 not sharing, 2 bad request, 3 loading) ‖ body``: the manifest JSON
after 0; after 3 a `LoadingNotice` JSON: the peer is loading the model of `step`
(`bytes` of weights, for `elapsed_s` so far), as a holder that restarted reads its own
checkpoint. A fetcher waits for such a peer as long as its size says a load may take
(`ModelFetchOptions.holder_wait_s`), not the fixed manifest timeout: a restarted holder on
a loaded machine took 11.3 s, its peers gave up after 10 s, and the run lost its model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Literal

import iroh
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from client_image.p2p import framing
from client_image.p2p.blobs import BlobDownloadError, BlobService, RateLimiter
from client_image.p2p.transport import Transport, TransportError

if TYPE_CHECKING:  # torch costs seconds to import; the coordinator imports this package
    import torch

logger = logging.getLogger(__name__)

MODEL_SHARING_ALPN = b"psyche/model-sharing/0"
MAX_MANIFEST_BYTES = 64 << 20
MODEL_TAG_PREFIX = "model-"
DTypeName = Literal[
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool"
]
# dtype name on the wire -> bytes per element; torch dtypes share these names
_ITEM_SIZES: dict[DTypeName, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype


def _dtype_name(dtype: torch.dtype) -> DTypeName | None:
    name = str(dtype).removeprefix("torch.")
    return next((known for known in _ITEM_SIZES if known == name), None)


class ModelSharingError(RuntimeError):
    """The model could not be fetched or a peer's manifest is unusable."""


class NotSharingYet(ModelSharingError):
    """A peer answered but shares no model, or an older one: it may be loading it."""


class HolderLoading(NotSharingYet):
    """A peer answered that it is loading the model of `notice.step`."""

    def __init__(self, message: str, notice: LoadingNotice):
        super().__init__(message)
        self.notice = notice


MANIFEST_RETRY_S = 0.5  # how often a peer that is not sharing yet is asked again
STATUS_OK, STATUS_NOT_SHARING, STATUS_BAD_REQUEST, STATUS_LOADING = 0, 1, 2, 3


class LoadingNotice(BaseModel):
    """What a peer that is loading a model says of it (status 3)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: Annotated[int, Field(ge=0)]
    bytes: Annotated[int, Field(ge=0)]
    elapsed_s: Annotated[float, Field(ge=0)] = 0.0


class ParameterEntry(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="hex", val_json_bytes="hex"
    )

    name: Annotated[str, Field(min_length=1, max_length=1024)]
    shape: list[Annotated[int, Field(ge=0)]]
    dtype: DTypeName
    size: Annotated[int, Field(ge=0)]
    hash: Annotated[bytes, Field(min_length=32, max_length=32)]

    def expected_size(self) -> int:
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * _ITEM_SIZES[self.dtype]


class ModelManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[2] = 2
    # The coordinator step at which the model was shared (the cooldown's step): a joiner
    # accepts only the model of its epoch's start step, never an older one a peer still holds.
    step: Annotated[int, Field(ge=0)] = 0
    parameters: list[ParameterEntry]
    config_json: str = ""
    tokenizer_json: str | None = None

    def validate_sizes(self) -> None:
        for entry in self.parameters:
            if entry.size != entry.expected_size():
                raise ModelSharingError(
                    f"manifest entry {entry.name!r}: {entry.size} bytes does not match "
                    f"shape {entry.shape} of {entry.dtype} ({entry.expected_size()} bytes)"
                )
        names = [e.name for e in self.parameters]
        if len(set(names)) != len(names):
            raise ModelSharingError("manifest lists a parameter name twice")


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """Raw little-endian bytes of a tensor in row-major order."""
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def tensor_from_bytes(data: bytes, entry: ParameterEntry) -> torch.Tensor:
    import torch

    dtype = _torch_dtype(entry.dtype)
    if not data:
        return torch.empty(entry.shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(entry.shape)


MEGABIT_BYTES = 125_000  # 10^6 bits


@dataclass(frozen=True)
class ModelFetchOptions:
    max_concurrent_parameter_requests: int = 8
    bandwidth_bytes_per_second: float | None = None  # one cap for the whole model's fetch
    # How long a peer that is not sharing the model may keep us waiting, unless it says
    # it is loading it: then `holder_wait_s` of the size it announces.
    manifest_timeout_s: float = 10.0
    # The slowest load of a holder's own checkpoint we still wait for (a busy disk and
    # CPU: reading, then building the model), and the longest wait whatever the size.
    holder_load_bytes_per_second: float = 5e6
    max_holder_wait_s: float = 900.0

    @classmethod
    def of_client(cls, max_concurrent_parameter_requests: int,
                  max_model_download_mbps: float | None) -> ModelFetchOptions:
        """The options the client's flags give (--max-concurrent-parameter-requests,
        --max-model-download-mbps: megabits per second, None for no cap)."""
        return cls(max_concurrent_parameter_requests=max_concurrent_parameter_requests,
                   bandwidth_bytes_per_second=None if max_model_download_mbps is None
                   else max_model_download_mbps * MEGABIT_BYTES)

    def holder_wait_s(self, notice: LoadingNotice) -> float:
        """How much longer to wait for a peer loading `notice.bytes`, `notice.elapsed_s`
        into its load: the manifest timeout (its start-up) plus the slowest load of that
        size, less what it already spent, at most max_holder_wait_s."""
        budget = self.manifest_timeout_s + notice.bytes / self.holder_load_bytes_per_second
        return min(self.max_holder_wait_s, max(0.0, budget - notice.elapsed_s))


@dataclass
class ModelFetchReport:
    parameters: int = 0
    total_bytes: int = 0
    served_by: Counter[bytes] = field(default_factory=Counter)


class ModelSharing:
    """Share this node's model with joiners, and fetch a model from peers."""

    def __init__(self, transport: Transport, blobs: BlobService) -> None:
        self.transport = transport
        self.blobs = blobs
        self._manifest: ModelManifest | None = None
        self._loading: tuple[int, int, float] | None = None  # step, bytes, monotonic start
        transport.register_protocol(MODEL_SHARING_ALPN, self._handle_connection)

    # -- sharing ---------------------------------------------------------------------------
    def share(
        self,
        state_dict: Mapping[str, torch.Tensor],
        config_json: str = "",
        tokenizer_json: str | None = None,
        step: int = 0,
    ) -> ModelManifest:
        """Publish ``state_dict``, the model at coordinator step ``step`` (replacing any
        model shared before)."""
        self.stop_sharing()
        entries = []
        for name, tensor in state_dict.items():
            dtype_name = _dtype_name(tensor.dtype)
            if dtype_name is None:
                raise ModelSharingError(f"parameter {name!r} has unsupported dtype {tensor.dtype}")
            data = tensor_bytes(tensor)
            digest = self.blobs.store.add(data, tag=MODEL_TAG_PREFIX + name)
            entries.append(
                ParameterEntry(
                    name=name,
                    shape=list(tensor.shape),
                    dtype=dtype_name,
                    size=len(data),
                    hash=digest,
                )
            )
        self._manifest = ModelManifest(
            step=step, parameters=entries, config_json=config_json, tokenizer_json=tokenizer_json
        )
        return self._manifest

    def announce_loading(self, step: int, total_bytes: int) -> None:
        """Tell fetchers this node is loading the model of `step` (`total_bytes` of
        weights): they wait for it as its size allows. `share` ends the announcement."""
        self.stop_sharing()
        self._loading = (step, total_bytes, time.monotonic())

    def loading_notice(self) -> LoadingNotice | None:
        if self._loading is None:
            return None
        step, total_bytes, started = self._loading
        return LoadingNotice(step=step, bytes=total_bytes,
                             elapsed_s=round(time.monotonic() - started, 3))

    def stop_sharing(self) -> None:
        self._manifest = None
        self._loading = None
        self.blobs.store.remove_tags_where(lambda tag: tag.startswith(MODEL_TAG_PREFIX))

    async def _handle_connection(self, connection: iroh.Connection) -> None:
        try:
            while True:
                stream = await connection.accept_bi()
                await self._serve_manifest(stream.send(), stream.recv())
        except iroh.IrohError:
            pass

    async def _serve_manifest(self, send: iroh.SendStream, recv: iroh.RecvStream) -> None:
        try:
            request = await asyncio.wait_for(framing.read_frame(recv, 1024), 10)
            manifest, loading = self._manifest, self.loading_notice()
            if request is None or b'"manifest"' not in request:
                reply = bytes([STATUS_NOT_SHARING])
            elif manifest is not None:
                reply = bytes([STATUS_OK]) + manifest.model_dump_json().encode()
            elif loading is not None:
                reply = bytes([STATUS_LOADING]) + loading.model_dump_json().encode()
            else:
                reply = bytes([STATUS_NOT_SHARING])
            await send.write_all(framing.encode_frame(reply))
            await send.finish()
        except (TimeoutError, framing.StreamClosed, framing.FrameTooLarge, iroh.IrohError) as error:
            logger.debug("manifest request failed: %s", error)
            with contextlib.suppress(Exception):
                await send.write_all(framing.encode_frame(bytes([STATUS_BAD_REQUEST])))
                await send.finish()

    # -- fetching --------------------------------------------------------------------------
    async def _first_manifest(self, peers: list[bytes], step: int | None,
                              options: ModelFetchOptions) -> ModelManifest:
        """Ask every source at once; the first manifest (of `step`, if given) wins. One at a
        time, each dead source (a restarted holder, common under churn) cost a whole
        timeout before the next was asked. A source that answers but shares no model (or
        an older one) is asked again every MANIFEST_RETRY_S until the manifest timeout; one
        that says it is loading the model of `step` is waited for as long as its size
        allows (`ModelFetchOptions.holder_wait_s`): a joiner that gave up on a restarted
        holder still reading its checkpoint sat the epoch out, and with it the epoch's only
        witness (a chaos run lost its model so)."""
        started = time.monotonic()

        async def ask(peer: bytes) -> ModelManifest:
            deadline = started + options.manifest_timeout_s
            while True:
                try:
                    offered = await self.fetch_manifest(
                        peer, max(0.1, deadline - time.monotonic()))
                    if step is not None and offered.step != step:
                        raise NotSharingYet(f"peer {peer.hex()[:8]} shares the model of "
                                            f"step {offered.step}, not {step}")
                    return offered
                except HolderLoading as loading:
                    if step is None or loading.notice.step == step:
                        deadline = max(deadline, time.monotonic()
                                       + options.holder_wait_s(loading.notice))
                    if time.monotonic() + MANIFEST_RETRY_S >= deadline:
                        raise
                    await asyncio.sleep(MANIFEST_RETRY_S)
                except NotSharingYet:
                    if time.monotonic() + MANIFEST_RETRY_S >= deadline:
                        raise
                    await asyncio.sleep(MANIFEST_RETRY_S)

        tasks = [asyncio.ensure_future(ask(peer)) for peer in peers]
        errors = []
        try:
            for next_done in asyncio.as_completed(tasks):
                try:
                    return await next_done
                except ModelSharingError as error:
                    errors.append(str(error))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        raise ModelSharingError("no source served a manifest: " + "; ".join(errors))

    async def fetch_manifest(self, source: bytes, timeout: float = 10.0) -> ModelManifest:
        async def request() -> bytes | None:
            connection = await self.transport.connect(source, MODEL_SHARING_ALPN)
            stream = await connection.open_bi()
            await stream.send().write_all(framing.encode_frame(b'{"v": 1, "kind": "manifest"}'))
            await stream.send().finish()
            return await framing.read_frame(stream.recv(), MAX_MANIFEST_BYTES)

        try:
            reply = await asyncio.wait_for(request(), timeout)
        except (
            TimeoutError,
            TransportError,
            framing.StreamClosed,
            framing.FrameTooLarge,
            iroh.IrohError,
        ) as error:
            raise ModelSharingError(f"manifest from {source.hex()[:8]} failed: {error}") from None
        if reply and reply[0] == STATUS_LOADING:
            try:
                notice = LoadingNotice.model_validate_json(reply[1:])
            except ValidationError as error:
                raise ModelSharingError(
                    f"invalid loading notice from {source.hex()[:8]}: {error.errors()[:3]}"
                ) from None
            raise HolderLoading(f"peer {source.hex()[:8]} is still loading the model of "
                                f"step {notice.step} ({notice.bytes} bytes, "
                                f"{notice.elapsed_s:.1f} s so far)", notice)
        if not reply or reply[0] != STATUS_OK:
            raise NotSharingYet(f"peer {source.hex()[:8]} is not sharing a model")
        try:
            manifest = ModelManifest.model_validate_json(reply[1:])
        except ValidationError as error:
            raise ModelSharingError(
                f"invalid manifest from {source.hex()[:8]}: {error.errors()[:3]}"
            ) from None
        manifest.validate_sizes()
        return manifest

    async def fetch_model(
        self,
        sources: Sequence[bytes],
        options: ModelFetchOptions | None = None,
        progress: Callable[[int, int], None] | None = None,
        step: int | None = None,
    ) -> tuple[ModelManifest, dict[str, torch.Tensor], ModelFetchReport]:
        """Download the model from ``sources`` only (e.g. the previous epoch's trainers).

        With ``step``, only a manifest of that step is accepted: a peer still sharing an
        older model is skipped. Parameters are fetched by content hash, so a peer without
        the manifest's exact tensors can never serve one."""
        options = options or ModelFetchOptions()
        peers = list(dict.fromkeys(s for s in sources if s != self.transport.node_id))
        if not peers:
            raise ModelSharingError("no peers to fetch the model from")
        manifest = await self._first_manifest(peers, step, options)

        limiter = (
            RateLimiter(options.bandwidth_bytes_per_second)
            if options.bandwidth_bytes_per_second
            else None
        )
        slots = asyncio.Semaphore(options.max_concurrent_parameter_requests)
        report = ModelFetchReport()
        state: dict[str, torch.Tensor] = {}

        async def fetch_one(index: int, entry: ParameterEntry) -> None:
            # parameter i starts at source i mod n: spreads the tensors across peers
            order = peers[index % len(peers) :] + peers[: index % len(peers)]
            async with slots:
                try:
                    data, provider = await self.blobs.fetch(entry.hash, entry.size, order, limiter)
                except BlobDownloadError as error:
                    raise ModelSharingError(f"parameter {entry.name!r}: {error}") from None
            state[entry.name] = tensor_from_bytes(data, entry)
            report.parameters += 1
            report.total_bytes += len(data)
            if provider is not None:
                report.served_by[provider] += 1
            if progress is not None:
                progress(report.parameters, len(manifest.parameters))

        tasks = [asyncio.create_task(fetch_one(i, e)) for i, e in enumerate(manifest.parameters)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        ordered = {entry.name: state[entry.name] for entry in manifest.parameters}
        return manifest, ordered, report
