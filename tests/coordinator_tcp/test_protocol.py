"""Wire codec: every message round-trips; anything else is a ProtocolError naming the problem."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import torch
from pydantic import BaseModel

from coordinator import Bloom, Witness, WitnessProof
from coordinator.config import GcsCheckpoint, HubCheckpoint
from coordinator_tcp.data_protocol import (
    DataRejected,
    DataRequest,
    DataResponse,
    DataWelcome,
    decode_data_client_message,
    decode_data_server_message,
)
from coordinator_tcp.protocol import (
    Challenge,
    CheckpointReport,
    ErrorReply,
    HealthCheck,
    HealthCheckEntry,
    Heartbeat,
    Join,
    ProtocolError,
    StateUpdate,
    WarmupWitness,
    Welcome,
    Withdraw,
    WitnessEval,
    WitnessMetadata,
    WitnessModel,
    WitnessSubmit,
    decode_client_message,
    decode_server_message,
    encode,
)
from psyche_common.tcp.framing import FrameError, encode_frame, read_frame


def _witness() -> WitnessModel:
    bloom = Bloom.from_words([i * 3 for i in range(16)], tuple(range(1, 9)))
    return WitnessModel.of(Witness(WitnessProof(2, 1, True), bloom, Bloom(), b"\x07" * 32))


CLIENT_MESSAGES = [
    Join(run_id="r", identity=b"\x01" * 32, p2p_address="x@127.0.0.1:1", signature=b"\x02" * 64),
    Join(run_id="r", identity=b"\x01" * 32, p2p_address="", signature=b"\x02" * 64, observe=True),
    WarmupWitness(witness=_witness()),
    WitnessSubmit(witness=_witness(), metadata=WitnessMetadata(step=3, loss=2.5)),
    WitnessSubmit(witness=_witness(), metadata=WitnessMetadata(
        step=4, evals=[WitnessEval(name="arc_easy", value=0.25)])),
    HealthCheck(checks=[HealthCheckEntry(node=b"\x03" * 32, committee="Trainer", position=1,
                                         index=0)]),
    CheckpointReport(index=0, hub=HubCheckpoint(repo_id="a/b", revision="c")),
    CheckpointReport(index=1, gcs=GcsCheckpoint(bucket="b", prefix="p")),
    Withdraw(),
]
SERVER_MESSAGES = [
    Challenge(nonce=b"\x09" * 32),
    Welcome(identity=b"\x01" * 32),
    StateUpdate(state=base64.b64encode(b"state").decode(), p2p_addresses={"ab": "x"},
                server_time=5, sent_at=1.5),
    Heartbeat(server_time=7),
    ErrorReply(error="E", detail="d", fatal=True),
]


@pytest.mark.parametrize("message", CLIENT_MESSAGES, ids=lambda m: m.type)
def test_client_messages_round_trip(message: BaseModel) -> None:
    assert decode_client_message(encode(message)) == message


@pytest.mark.parametrize("message", SERVER_MESSAGES, ids=lambda m: m.type)
def test_server_messages_round_trip(message: BaseModel) -> None:
    assert decode_server_message(encode(message)) == message


def test_a_state_update_names_joined_only_for_observers() -> None:
    """A client's update has no `joined` key (an earlier client, which forbids unknown
    fields, still reads it); an observer's says how many clients are connected."""
    update = StateUpdate(state=base64.b64encode(b"state").decode(), server_time=5)
    assert b"joined" not in update.to_frame()
    assert decode_server_message(update.to_frame()) == update
    observed = update.model_copy(update={"joined": 2})
    again = decode_server_message(observed.to_frame())
    assert isinstance(again, StateUpdate) and again.joined == 2


def test_witness_model_keeps_every_field() -> None:
    original = _witness().to_witness()
    again = decode_client_message(encode(WitnessSubmit(witness=WitnessModel.of(original))))
    assert isinstance(again, WitnessSubmit)
    assert again.witness.to_witness() == original


def test_data_messages_round_trip() -> None:
    samples = torch.arange(12, dtype=torch.int64).reshape(3, 4) * 1000
    for message in [DataWelcome(num_sequences=10, seq_len=4), DataResponse.of(2, 4, samples),
                    DataRejected(start=1, end=2, reason="NotInThisRound", detail="x")]:
        assert decode_data_server_message(encode(message)) == message
    request = DataRequest(start=3, end=9)
    assert decode_data_client_message(encode(request)) == request
    decoded = decode_data_server_message(encode(DataResponse.of(2, 4, samples)))
    assert isinstance(decoded, DataResponse)
    assert torch.equal(decoded.samples(4), samples)


def test_data_response_of_the_wrong_size_is_rejected() -> None:
    response = DataResponse.of(0, 1, torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ProtocolError, match="hold 32 bytes, expected 48"):
        response.samples(6)
    with pytest.raises(ProtocolError, match="not base64"):
        DataResponse(start=0, end=0, tokens="@@@").samples(4)


@pytest.mark.parametrize(("frame", "expected"), [
    (b"\xff\xfe garbage", "not JSON"),
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'{"version": 3}', "no `type` field"),
    (b'{"type": "join", "version": 1}', "unsupported protocol version 1"),
    (b'{"type": "teleport", "version": 3}', "type"),
    (b'{"type": "withdraw", "version": 3, "extra": 1}', "extra: Extra inputs are not permitted"),
    (json.dumps({"type": "join", "run_id": "r", "identity": "zz", "p2p_address": "",
                 "signature": "00" * 64}).encode(), "identity"),
    (json.dumps({"type": "join", "run_id": "r", "identity": "01" * 31, "p2p_address": "",
                 "signature": "00" * 64}).encode(), "expected 32 bytes, got 31"),
    (json.dumps({"type": "health_check", "checks": []}).encode(), "checks"),
    (b'{"type": "join", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
])
def test_bad_client_frames_are_protocol_errors(frame: bytes, expected: str) -> None:
    with pytest.raises(ProtocolError, match=r"invalid client message|unsupported") as caught:
        decode_client_message(frame)
    assert expected in str(caught.value)


def test_unknown_type_names_the_tag() -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_server_message(b'{"type": "teleport", "version": 3}')
    assert "teleport" in str(caught.value)


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_frames_round_trip_and_limits() -> None:
    assert await read_frame(_reader(encode_frame(b"hello")), 10) == b"hello"
    with pytest.raises(FrameError, match="exceeds the limit of 10 bytes"):
        await read_frame(_reader(encode_frame(b"x" * 11)), 10)
    with pytest.raises(FrameError, match="connection closed inside a frame \\(3 of 5 bytes\\)"):
        await read_frame(_reader(encode_frame(b"hello")[:-2]), 10)
    with pytest.raises(asyncio.IncompleteReadError):
        await read_frame(_reader(b"\x00\x00"), 10)


def test_witness_metadata_carries_up_to_eight_eval_scores_by_psyches_rule() -> None:
    scores = {f"task{i}": {"acc": i / 10} for i in range(10)} | {
        "arc_easy": {"acc": 0.5, "acc_norm": 0.75}}
    evals = WitnessMetadata.evals_of(scores)
    assert len(evals) == 8 and evals[0] == WitnessEval(name="arc_easy", value=0.75)
    assert evals[1] == WitnessEval(name="task0", value=0.0)
    assert WitnessMetadata.evals_of({"x" * 40: {"acc": 1.0}})[0].name == "x" * 32
    frame = encode(WitnessSubmit(witness=_witness(), metadata=WitnessMetadata(evals=evals)))
    assert decode_client_message(frame) == WitnessSubmit(
        witness=_witness(), metadata=WitnessMetadata(evals=evals))
    hostile = json.loads(frame)
    hostile["metadata"]["evals"] = [{"name": "t", "value": 1.0}] * 9
    with pytest.raises(ProtocolError, match="evals"):
        decode_client_message(json.dumps(hostile).encode())
    hostile["metadata"]["evals"] = [{"name": "t" * 33, "value": 1.0}]
    with pytest.raises(ProtocolError, match="name"):
        decode_client_message(json.dumps(hostile).encode())
