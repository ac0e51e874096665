"""Labels over the TCP data server (Psyche's TrainingData `labels`): a server whose samples
have labels sends them with the tokens, the client's TcpDataProvider hands them to a
Finetuning run, and a response whose labels do not fit is a clean ProtocolError."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tcp_helpers import RUN_ID, TESTNET, identity

from client_image.data import fetch_training_batch
from client_image.data.preprocessed import PreprocessedDataProvider
from client_image.data.tcp_provider import TcpDataProvider
from client_image.formats.batch import IGNORE_INDEX, split_labels
from coordinator.config import load_data_config
from coordinator_tcp.data_protocol import (
    DataResponse,
    decode_data_server_message,
    max_samples_per_request,
)
from coordinator_tcp.data_server import DataServer, DataServerOptions
from psyche_common.tcp.messages import ProtocolError, encode

SEQ = 8
MEMBER = identity(1)


def _rows(count: int) -> tuple[list[list[int]], list[list[int]]]:
    inputs = [[100 * row + i for i in range(SEQ)] for row in range(count)]
    labels = [[IGNORE_INDEX] * 3 + tokens[3:] for tokens in inputs]
    return inputs, labels


@pytest.fixture
async def labelled_server(tmp_path: Path) -> AsyncIterator[DataServer]:
    inputs, labels = _rows(5)
    pq.write_table(pa.table({"inputs": inputs, "labels": labels}), tmp_path / "train.parquet")
    config = load_data_config(TESTNET / "data.toml").model_copy(update={"seq_len": SEQ})
    server = DataServer(config, RUN_ID, members=lambda: {MEMBER.public_key},
                        options=DataServerOptions(host="127.0.0.1", port=0),
                        provider=PreprocessedDataProvider(tmp_path, SEQ))
    await server.start()
    yield server
    await server.stop()


async def test_labels_round_trip_to_a_finetuning_batch(labelled_server: DataServer) -> None:
    provider = await TcpDataProvider.open(f"127.0.0.1:{labelled_server.port}", MEMBER,
                                          RUN_ID, SEQ, attempts=1)
    try:
        inputs, labels = _rows(5)
        got_inputs, got_labels = await provider.fetch_labelled(1, 3)
        assert got_inputs.tolist() == inputs[1:4]
        assert got_labels is not None and got_labels.tolist() == labels[1:4]
        batch_inputs, batch_labels = split_labels(
            await fetch_training_batch(provider, 0, 4, "Finetuning"))
        assert batch_inputs.tolist() == inputs and batch_labels is not None
        assert batch_labels.tolist() == labels
        # A Pretraining run takes the tokens only, as before.
        assert (await fetch_training_batch(provider, 0, 1, "Pretraining")).tolist() == inputs[:2]
    finally:
        await provider.aclose()
    # Labels double a response: the server caps its requests to fit one frame.
    assert labelled_server.max_samples == max_samples_per_request(SEQ, labelled=True)
    assert labelled_server.max_samples < max_samples_per_request(SEQ)


def _frame(**fields: object) -> bytes:
    tokens = torch.arange(2 * SEQ).reshape(2, SEQ)
    message = json.loads(encode(DataResponse.of(0, 1, tokens)))
    message.update(fields)
    return json.dumps(message).encode()


def test_responses_without_labels_decode_as_before() -> None:
    reply = decode_data_server_message(_frame())
    assert isinstance(reply, DataResponse)
    assert reply.sample_labels(SEQ) is None
    assert reply.samples(SEQ).tolist() == torch.arange(2 * SEQ).reshape(2, SEQ).tolist()


@pytest.mark.parametrize("labels, message", [
    (base64.b64encode(b"\x00" * 12).decode(),
     r"data response labels for \[0, 1\] hold 12 bytes, expected 64 \(2 samples of 8"),
    (base64.b64encode(b"\x00" * (10**6)).decode(), r"labels for \[0, 1\] hold 1000000 bytes"),
    ("not base64!", r"data response labels are not base64"),
])
def test_a_hostile_labels_length_is_a_clean_refusal(labels: str, message: str) -> None:
    reply = decode_data_server_message(_frame(labels=labels))
    assert isinstance(reply, DataResponse)
    with pytest.raises(ProtocolError, match=message):
        reply.sample_labels(SEQ)


def test_labels_of_the_wrong_type_are_refused_when_decoding() -> None:
    with pytest.raises(ProtocolError, match=r"invalid data server message: data_response.labels: "):
        decode_data_server_message(_frame(labels=[1, 2, 3]))
