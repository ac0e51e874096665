"""Codec tolerance: every malformed input is a clear, typed error, never a crash."""

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client_image.p2p import (
    MAX_MESSAGE_BYTES,
    MAX_PAYLOAD_BYTES,
    AddressError,
    BatchId,
    BroadcastDecodeError,
    Finished,
    Identity,
    PeerAddress,
    ResultAnnouncement,
    SignedMessage,
    decode_broadcast,
    encode_broadcast,
    topic_for_run,
)
from client_image.p2p.gossip.wire import MAX_CONTROL_BYTES, GossipWireError, decode_control

TOPIC = topic_for_run("run")


def test_topic_is_sha256_of_prefix_and_run_id() -> None:
    import hashlib

    assert topic_for_run("abc") == hashlib.sha256(b"psyche gossipabc").digest()


@given(
    node_id=st.binary(min_size=32, max_size=32),
    ports=st.lists(st.integers(1, 65535), max_size=4),
    relay=st.none() | st.just("https://relay.example/"),
)
def test_address_round_trip(node_id: bytes, ports: list[int], relay: str | None) -> None:
    addresses = tuple(f"127.0.0.{i + 1}:{p}" for i, p in enumerate(ports)) + (
        ("[::1]:9",) if ports else ()
    )
    address = PeerAddress(node_id, addresses, relay)
    assert PeerAddress.parse(address.to_string()) == address


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nothing", "no '@'"),
        ("ab@1.2.3.4:5", "64 hex digits"),
        ("zz" * 32 + "@1.2.3.4:5", "not hexadecimal"),
        ("00" * 32 + "@host:5", "IP address"),
        ("00" * 32 + "@1.2.3.4:0", "valid port"),
        ("00" * 32 + "@1.2.3.4", "ip:port"),
        ("00" * 32 + "@1.2.3.4:5;via=x", "relay=<url>"),
    ],
)
def test_bad_addresses_are_named(text: str, message: str) -> None:
    with pytest.raises(AddressError, match=message):
        PeerAddress.parse(text)


@given(st.text(max_size=200))
def test_address_parser_only_raises_address_error(text: str) -> None:
    with contextlib.suppress(AddressError):
        PeerAddress.parse(text)


def announcement(step: int = 5) -> ResultAnnouncement:
    return ResultAnnouncement(
        step=step,
        batch_id=BatchId(start=10, end=13),
        commitment=bytes(range(32)),
        blob_hash=bytes(32),
        blob_size=940_000,
    )


def test_broadcasts_round_trip() -> None:
    messages: list[ResultAnnouncement | Finished] = [
        announcement(),
        Finished(step=3, warmup=True, broadcast_bloom=b"\x01\x02"),
    ]
    for message in messages:
        assert decode_broadcast(encode_broadcast(message)) == message


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"{", "Invalid JSON"),
        (b'{"kind": "gradient", "step": 1}', "does not match any of the expected tags"),
        (encode_broadcast(announcement()).replace(b'"version":1', b'"version":2'), "version"),
        (encode_broadcast(announcement()).replace(b'"end":13', b'"end":2'), "before start"),
        (encode_broadcast(announcement()).replace(b'"step":5', b'"step":-1'), "step"),
        (b"x" * (MAX_PAYLOAD_BYTES + 1), "exceeds"),
    ],
)
def test_bad_broadcasts_are_named(payload: bytes, message: str) -> None:
    with pytest.raises(BroadcastDecodeError, match=message):
        decode_broadcast(payload)


@given(st.binary(max_size=300))
def test_broadcast_decoder_only_raises_its_error(payload: bytes) -> None:
    with contextlib.suppress(BroadcastDecodeError):
        decode_broadcast(payload)


def test_signed_message_limits_and_forgery() -> None:
    identity = Identity.generate()
    message = SignedMessage.create(identity, TOPIC, b"p" * MAX_PAYLOAD_BYTES)
    assert len(message.encode()) == MAX_MESSAGE_BYTES
    decoded = SignedMessage.decode(message.encode())
    assert decoded == message and decoded.is_authentic(TOPIC)
    assert not decoded.is_authentic(topic_for_run("another run"))  # no cross-run replay
    forged = SignedMessage(Identity.generate().public_key, message.signature, message.payload)
    assert not forged.is_authentic(TOPIC)
    with pytest.raises(GossipWireError, match="exceeds"):
        SignedMessage.create(identity, TOPIC, b"p" * (MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(GossipWireError, match="shorter"):
        SignedMessage.decode(b"tiny")
    # same sender and payload -> same id (Ed25519 is deterministic), so dedupe is exact
    assert (
        SignedMessage.create(identity, TOPIC, b"a").message_id
        == SignedMessage.create(identity, TOPIC, b"a").message_id
    )


def test_a_deeply_nested_control_frame_is_a_wire_error_not_a_recursion_error() -> None:
    depth = (MAX_CONTROL_BYTES - 2) // 2  # as deep as fits in one control frame
    with pytest.raises(GossipWireError, match="nested too deeply"):
        decode_control(b"[" * depth + b"]" * depth)
