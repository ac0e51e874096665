"""Typed gossip payloads the client runtime broadcasts: result announcements and Finished.

Encoded as compact JSON with a version and a ``kind`` discriminator, validated
at the edge by pydantic: a payload that does not decode raises
``BroadcastDecodeError`` naming the problem, and is counted as malformed by the
caller, never half-applied. Byte fields travel as hex. Mirrors Psyche's
``Broadcast{step, nonce, commitment, data: TrainingResult | Finished}``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from client_image.p2p.gossip.wire import MAX_PAYLOAD_BYTES

U32 = Annotated[int, Field(ge=0, lt=2**32)]
U64 = Annotated[int, Field(ge=0, lt=2**64)]
HexBytes = Annotated[bytes, Field(max_length=1024)]


class BroadcastDecodeError(ValueError):
    """A gossip payload that is not a valid broadcast of a supported version."""


class _Broadcast(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="hex", val_json_bytes="hex"
    )

    version: Literal[1] = 1
    step: U32
    # Bumped when a broadcast is re-sent so de-duplication treats it as new (Psyche's nonce).
    nonce: U32 = 0


class BatchId(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    start: U64
    end: U64

    @model_validator(mode="after")
    def _ordered(self) -> BatchId:
        if self.end < self.start:
            raise ValueError(f"batch id end {self.end} is before start {self.start}")
        return self


class ResultAnnouncement(_Broadcast):
    """A trainer's result for ``batch_id`` at ``step``: fetch ``blob_hash`` (``blob_size`` bytes)."""

    kind: Literal["result"] = "result"
    batch_id: BatchId
    commitment: Annotated[HexBytes, Field(min_length=32, max_length=32)]
    blob_hash: Annotated[HexBytes, Field(min_length=32, max_length=32)]
    blob_size: U64


class Finished(_Broadcast):
    """A trainer has shared every result of ``step`` (``warmup``: finished the warmup download)."""

    kind: Literal["finished"] = "finished"
    warmup: bool = False
    broadcast_bloom: HexBytes = b""


Broadcast = Annotated[ResultAnnouncement | Finished, Field(discriminator="kind")]
_BROADCAST_ADAPTER: TypeAdapter[ResultAnnouncement | Finished] = TypeAdapter(Broadcast)


def encode_broadcast(message: ResultAnnouncement | Finished) -> bytes:
    encoded = message.model_dump_json().encode()
    if len(encoded) > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"broadcast of {len(encoded)} bytes exceeds the gossip limit {MAX_PAYLOAD_BYTES}"
        )
    return encoded


def decode_broadcast(payload: bytes) -> ResultAnnouncement | Finished:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise BroadcastDecodeError(f"broadcast of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    try:
        return _BROADCAST_ADAPTER.validate_json(payload)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}"
            for e in error.errors()[:5]
        )
        raise BroadcastDecodeError(f"invalid broadcast: {problems}") from None
