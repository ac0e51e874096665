"""Hostile peers on the coordinator's TCP port: generated garbage, mutated messages and a
slow sender, while an honest client keeps the run going. Decoders only ever raise
ProtocolError; the server only ever answers with an error and hangs up."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tcp_helpers import RUN_ID, Clock, identity, join, next_state

from coordinator import RunState, Witness, WitnessProof, decode_state
from coordinator_tcp.data_protocol import decode_data_client_message, decode_data_server_message
from coordinator_tcp.protocol import (
    ProtocolError,
    WarmupWitness,
    WitnessModel,
    decode_client_message,
    decode_server_message,
)
from coordinator_tcp.server import CoordinatorServer
from psyche_common.tcp.framing import encode_frame, read_frame
from psyche_common.tcp.messages import signed_join

DECODERS = [decode_client_message, decode_server_message, decode_data_client_message,
            decode_data_server_message]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20)
TYPES = ["join", "witness", "warmup_witness", "health_check", "checkpoint", "withdraw",
         "state", "challenge", "welcome", "heartbeat", "error", "data_request"]


@st.composite
def near_messages(draw: st.DrawFn) -> bytes:
    """Envelopes that look right (a known type, version 1) with random fields."""
    body: dict[str, Any] = draw(st.dictionaries(st.sampled_from(
        ["run_id", "identity", "signature", "p2p_address", "witness", "checks", "index",
         "hub", "start", "end", "nonce", "observe", "metadata"]), JSON, max_size=6))
    body.update(type=draw(st.sampled_from(TYPES)), version=draw(st.sampled_from([1, 1, 2, "1"])))
    return json.dumps(body).encode()


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(frame=st.binary(max_size=512) | near_messages() | JSON.map(lambda v: json.dumps(v).encode()))
def test_decoders_only_raise_protocol_errors(frame: bytes) -> None:
    for decode in DECODERS:
        try:
            decode(frame)
        except ProtocolError as error:
            assert str(error)  # every refusal says what is wrong


async def hostile(server: CoordinatorServer, frames: list[bytes], *, join_first: bool) -> bytes:
    """Send `frames` (after a valid join when asked); return what the server said last."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        nonce = decode_server_message(await read_frame(reader, 1 << 26)).nonce  # type: ignore[union-attr]  # the first frame is a Challenge
        if join_first:
            join_message = signed_join(identity(9), nonce, RUN_ID, "hostile")
            writer.write(encode_frame(join_message.model_dump_json().encode()))
        for frame in frames:
            writer.write(encode_frame(frame))
        await writer.drain()
        last = b""
        while True:
            try:
                last = await asyncio.wait_for(read_frame(reader, 1 << 26), 5) or last
            except (asyncio.IncompleteReadError, ConnectionError):
                return last
    finally:
        writer.close()


async def test_the_run_goes_on_through_garbage_mutations_and_a_slow_sender(
        clocked: tuple[CoordinatorServer, Clock]) -> None:
    server, clock = clocked
    honest = await join(server, identity(1))
    await next_state(honest)
    garbage = [b"\xff" * 40, b"[1,2,3]", b'{"type":"join","version":2}',
               b'{"type":"witness","version":2,"witness":{"position":-1}}',
               b"{" * 5000, json.dumps({"type": "join", "version": 3, "run_id": "x" * 99}).encode()]
    # Before the join: each is refused as a handshake failure.
    for frame in garbage:
        reply = decode_server_message(await hostile(server, [frame], join_first=False))
        assert reply.type == "error" and reply.fatal  # type: ignore[union-attr]  # checked to be an ErrorReply by its type
    # After a valid join: the garbage gets an error reply and that connection only is cut.
    for frame in garbage:
        reply = decode_server_message(await hostile(server, [frame], join_first=True))
        assert reply.type == "error"
    # A slow sender: a frame header, one byte at a time, never finished.
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    await read_frame(reader, 1 << 26)
    for byte in b"\x00\x00\x01":
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(0.2)
    closed = await asyncio.wait_for(reader.read(), server.options.handshake_timeout_s + 3)
    assert b"HandshakeFailed" in closed
    writer.close()
    assert server.stats.protocol_errors >= len(garbage)
    # Throughout, the honest client was served and the run still moves on for it.
    clock.now += 2  # waiting_for_members_extra_time elapses: the honest client's epoch starts
    state = decode_state((await next_state(honest)).state_bytes)
    while state.run_state is not RunState.Warmup:
        state = decode_state((await next_state(honest)).state_bytes)
    witness = Witness(WitnessProof(position=0, index=0, witness=False))
    await honest.send(WarmupWitness(witness=WitnessModel.of(witness)))
    while state.run_state is not RunState.RoundTrain:
        state = decode_state((await next_state(honest)).state_bytes)
    assert [c.id.key for c in state.epoch_state.clients] == [identity(1).public_key]
    await honest.close()
