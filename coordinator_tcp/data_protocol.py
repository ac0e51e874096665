"""Messages of the TCP data server (Psyche's `RequestTrainingData` protocol;
docs/data-and-checkpoints.md, "TCP data server").

Same framing and authentication as the coordinator connection:

    server -> client   Challenge{nonce}
    client -> server   Join{run_id, identity, signature, ...}   (p2p_address unused)
    server -> client   DataWelcome{num_sequences, seq_len} | ErrorReply(fatal) and close
    then               client: DataRequest{start, end}           (batch id, inclusive)
                       server: DataResponse{start, end, tokens, labels?} | DataRejected{start, end, reason}

`tokens` is base64 of the samples start..end as little-endian int32 (Psyche widens u16/u32
tokens to i32), row-major [end - start + 1, seq_len]; `labels`, present when the served
data has them (Psyche's TrainingData `labels`; -100: not in the loss), the same for
their labels. A request from a key that is not a
client of the current epoch is rejected with `NotInThisRound`; an out-of-range batch with
`OutOfRange`; one too large for a frame with `TooLarge`. Garbage gets an ErrorReply and
a disconnect.
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field, TypeAdapter

from coordinator_tcp.protocol import U64
from psyche_common.tcp.framing import CLIENT_MAX_FRAME
from psyche_common.tcp.messages import Challenge, ErrorReply, Join, ProtocolError, validate_frame
from psyche_common.tcp.messages import Message as _Message

TOKEN_BYTES = 4  # int32 on the wire
# A response frame holds base64 (4/3) of the tokens plus a small JSON envelope.
_ENVELOPE_SLACK = 4096


class DataWelcome(_Message):
    type: Literal["data_welcome"] = "data_welcome"
    num_sequences: U64
    seq_len: Annotated[int, Field(gt=0, lt=2**32)]


class DataRequest(_Message):
    type: Literal["data_request"] = "data_request"
    start: U64
    end: U64


class DataResponse(_Message):
    type: Literal["data_response"] = "data_response"
    start: U64
    end: U64
    tokens: str
    labels: str | None = None

    @classmethod
    def of(cls, start: int, end: int, samples: torch.Tensor,
           labels: torch.Tensor | None = None) -> DataResponse:
        return cls(start=start, end=end, tokens=_to_base64(samples),
                   labels=None if labels is None else _to_base64(labels))

    def samples(self, seq_len: int) -> torch.Tensor:
        """The tokens as int64 [end - start + 1, seq_len]; ProtocolError if the size is wrong."""
        return self._decode(self.tokens, "tokens", seq_len)

    def sample_labels(self, seq_len: int) -> torch.Tensor | None:
        """The labels as int64 [end - start + 1, seq_len], None when the response has none;
        ProtocolError if their size is wrong."""
        return None if self.labels is None else self._decode(self.labels, "labels", seq_len)

    def _decode(self, field: str, name: str, seq_len: int) -> torch.Tensor:
        try:
            raw = base64.b64decode(field, validate=True)
        except ValueError as exc:
            raise ProtocolError(f"data response {name} are not base64: {exc}") from None
        rows = self.end - self.start + 1
        expected = rows * seq_len * TOKEN_BYTES
        if self.end < self.start or len(raw) != expected:
            raise ProtocolError(
                f"data response {name} for [{self.start}, {self.end}] hold {len(raw)} bytes, "
                f"expected {expected} ({rows} samples of {seq_len} int32 values)")
        values = np.frombuffer(raw, dtype="<i4").astype(np.int64).reshape(rows, seq_len)
        return torch.from_numpy(values)


def _to_base64(values: torch.Tensor) -> str:
    return base64.b64encode(values.numpy().astype("<i4", copy=False).tobytes()).decode()


RejectReason = Literal["NotInThisRound", "OutOfRange", "TooLarge"]


class DataRejected(_Message):
    type: Literal["data_rejected"] = "data_rejected"
    start: U64
    end: U64
    reason: RejectReason
    detail: str = ""


def max_samples_per_request(seq_len: int, max_frame: int = CLIENT_MAX_FRAME, *,
                            labelled: bool = False) -> int:
    """The most samples whose base64 int32 tokens (and labels, if `labelled`) fit one
    client frame."""
    per_sample = seq_len * TOKEN_BYTES * (2 if labelled else 1)
    return max(1, (max_frame - _ENVELOPE_SLACK) * 3 // 4 // per_sample)


_DATA_SERVER: TypeAdapter[
    Challenge | DataWelcome | DataResponse | DataRejected | ErrorReply
] = TypeAdapter(
    Annotated[Challenge | DataWelcome | DataResponse | DataRejected | ErrorReply,
              Field(discriminator="type")])
_DATA_CLIENT: TypeAdapter[Join | DataRequest] = TypeAdapter(
    Annotated[Join | DataRequest, Field(discriminator="type")])


def decode_data_server_message(
    frame: bytes,
) -> Challenge | DataWelcome | DataResponse | DataRejected | ErrorReply:
    return validate_frame(_DATA_SERVER, frame, "data server")


def decode_data_client_message(frame: bytes) -> Join | DataRequest:
    return validate_frame(_DATA_CLIENT, frame, "data client")
