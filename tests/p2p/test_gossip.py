"""Gossip over real iroh endpoints on 127.0.0.1 (relays disabled)."""

import asyncio
import dataclasses
import itertools

import iroh
import pytest

from client_image.p2p import (
    GOSSIP_ALPN,
    BatchId,
    GossipConfig,
    GossipTopic,
    Identity,
    NodeConfig,
    P2PNode,
    PeerAddress,
    ResultAnnouncement,
    SignedMessage,
    decode_broadcast,
    encode_broadcast,
    framing,
)
from client_image.p2p.gossip.wire import (
    FrameKind,
    decode_control,
    encode_control,
    encode_message_frame,
    split_frame,
)
from client_image.p2p.transport import Transport

from .swarm import started_nodes, subscribe_chain, wait_until

pytestmark = pytest.mark.timeout(90)  # a hang fails fast instead of blocking CI

RUN = "run-gossip-test"
SPARSE = GossipConfig(
    max_active_view=4, target_neighbours=2, maintenance_interval_s=0.1, handshake_timeout_s=3.0
)


def connected(topics: list[GossipTopic], nodes: list[P2PNode]) -> bool:
    """Is the graph of mutual neighbour links one connected component?"""
    ids = {node.node_id: topic for node, topic in zip(nodes, topics, strict=True)}

    def mutual(peer: bytes) -> list[bytes]:
        return [p for p in ids[peer].neighbours() if p in ids and peer in ids[p].neighbours()]

    seen, frontier = set(), [nodes[0].node_id]
    while frontier:
        peer = frontier.pop()
        if peer in seen:
            continue
        seen.add(peer)
        frontier.extend(mutual(peer))
    return len(seen) == len(nodes)


def announcement(step: int, index: int) -> bytes:
    return encode_broadcast(
        ResultAnnouncement(
            step=step,
            batch_id=BatchId(start=index, end=index),
            commitment=bytes([index]) * 32,
            blob_hash=bytes([step]) * 32,
            blob_size=1000 + index,
        )
    )


async def drain(topic: GossipTopic, settle: float = 0.8) -> list[tuple[bytes, bytes]]:
    """Everything delivered so far, once nothing new arrived for ``settle`` seconds."""
    received: list[tuple[bytes, bytes]] = []
    while True:
        try:
            message = await topic.next_message(settle)
        except TimeoutError:
            return received
        received.append((message.sender, message.payload))


@pytest.mark.parametrize("lazy_push", [False, True], ids=["flooding", "plumtree"])
async def test_six_sparse_nodes_deliver_every_announcement_exactly_once(lazy_push: bool) -> None:
    config = dataclasses.replace(SPARSE, lazy_push=lazy_push)
    async with started_nodes(6, gossip_config=config) as nodes:
        topics = subscribe_chain(nodes, RUN)
        await wait_until(lambda: connected(topics, nodes), what="a connected overlay")
        not_adjacent = [
            (a, b)
            for a, b in itertools.combinations(range(6), 2)
            if nodes[b].node_id not in topics[a].neighbours()
        ]
        assert not_adjacent, "the overlay must not be a full mesh for this test"

        for step in (1, 2):
            for index, topic in enumerate(topics):
                await topic.broadcast(announcement(step, index))
        drained = await asyncio.gather(*(drain(topic) for topic in topics))
        for index, (topic, received) in enumerate(zip(topics, drained, strict=True)):
            expected = sorted(
                (nodes[j].node_id, announcement(step, j))
                for step in (1, 2)
                for j in range(6)
                if j != index
            )
            assert sorted(received) == expected  # every one, and each exactly once
            assert all(isinstance(decode_broadcast(p), ResultAnnouncement) for _, p in received)
            assert topic.stats.delivered == 10
            assert topic.stats.forged == topic.stats.malformed == topic.stats.oversized == 0


async def attach_raw_peer(transport: Transport,
                          target: P2PNode) -> tuple[iroh.SendStream, iroh.RecvStream]:
    """Handshake on the gossip ALPN by hand, as a misbehaving peer would."""
    connection = await transport.connect(target.node_id, GOSSIP_ALPN)
    stream = await connection.open_bi()
    send, recv = stream.send(), stream.recv()
    hello = {
        "topic": target.gossip.subscribe(RUN).topic.hex(),
        "address": transport.address.to_string(),
    }
    await send.write_all(framing.encode_frame(encode_control(FrameKind.HELLO, hello)))
    reply = await asyncio.wait_for(framing.read_frame(recv, 1 << 16), 5)
    assert reply is not None
    kind, body = split_frame(reply)
    assert kind == FrameKind.ACCEPT, decode_control(body)
    return send, recv


async def test_forged_oversized_and_malformed_messages_are_dropped_without_disturbing_delivery() -> (
    None
):
    async with started_nodes(6, gossip_config=SPARSE) as nodes:
        topics = subscribe_chain(nodes, RUN)
        await wait_until(lambda: connected(topics, nodes), what="a connected overlay")
        attacker = Transport(Identity.generate(), NodeConfig.loopback())
        await attacker.start()
        try:
            target_index = min(range(6), key=lambda i: len(topics[i].neighbours()))
            target = nodes[target_index]
            attacker.add_peer_address(target.address)
            send, _ = await attach_raw_peer(attacker, target)
            victim = nodes[(target_index + 1) % 6]
            honest = SignedMessage.create(victim.identity, topics[0].topic, b"genuine")
            forged = SignedMessage(victim.node_id, honest.signature, b"forged: pay the attacker")
            oversized = bytes([FrameKind.MESSAGE]) + b"\x00" * 5000
            own = SignedMessage.create(
                attacker.identity, topics[0].topic, b"attacker's valid message"
            )
            for frame in [
                encode_message_frame(forged),
                oversized,
                b"\x09junk",
                bytes([FrameKind.IHAVE]) + b"not a whole id" * 3,
                encode_message_frame(own),
            ]:
                await send.write_all(framing.encode_frame(frame))

            await wait_until(
                lambda: topics[target_index].stats.oversized == 1, what="the oversized frame"
            )
            for index, topic in enumerate(topics):
                await topic.broadcast(announcement(3, index))
            drained = await asyncio.gather(*(drain(topic) for topic in topics))
            for index, received in enumerate(drained):
                payloads = sorted(p for _, p in received)
                expected = sorted(
                    [announcement(3, j) for j in range(6) if j != index]
                    + [b"attacker's valid message"]
                )
                assert payloads == expected
            stats = topics[target_index].stats
            assert (stats.forged, stats.oversized, stats.malformed) == (1, 1, 2)
            assert (
                attacker.node_id in topics[target_index].neighbours()
            )  # still served after the junk
        finally:
            await attacker.stop()


async def test_overlay_heals_when_a_peer_leaves_and_admits_a_joiner() -> None:
    tight = GossipConfig(
        max_active_view=2, target_neighbours=2, maintenance_interval_s=0.1, handshake_timeout_s=3.0
    )
    async with started_nodes(5, gossip_config=tight) as nodes:
        topics = subscribe_chain(nodes[:4], RUN)
        await wait_until(lambda: connected(topics, nodes[:4]), what="a connected overlay")
        await nodes[1].stop()  # a middle peer of the initial line leaves
        survivors = [0, 2, 3]
        alive_nodes = [nodes[i] for i in survivors]
        alive_topics = [topics[i] for i in survivors]
        await wait_until(
            lambda: (
                connected(alive_topics, alive_nodes)
                and all(nodes[1].node_id not in t.neighbours() for t in alive_topics)
            ),
            what="the overlay to heal",
        )
        joiner_topic = nodes[4].subscribe(RUN, [nodes[3].address])
        await wait_until(lambda: len(joiner_topic.neighbours()) >= 1, what="the joiner to connect")
        await alive_topics[0].broadcast(b"after the churn")
        for topic in [*alive_topics[1:], joiner_topic]:
            message = await topic.next_message(5)
            assert (message.sender, message.payload) == (nodes[0].node_id, b"after the churn")


async def test_messages_sent_while_alone_reach_peers_that_join_later() -> None:
    async with started_nodes(2, gossip_config=SPARSE) as (early, late):
        early_topic = early.subscribe(RUN)
        await early_topic.broadcast(b"announced before anyone listened")
        late_topic = late.subscribe(RUN, [early.address])
        message = await late_topic.next_message(5)  # offered by IHAVE on the new link, grafted
        assert (message.sender, message.payload) == (
            early.node_id,
            b"announced before anyone listened",
        )
        await asyncio.sleep(0.3)
        assert late_topic.stats.delivered == 1 and late_topic.stats.grafts == 1


async def test_a_gossiped_address_never_replaces_a_known_one() -> None:
    """A peer's HELLO naming another node at a stale or forged port (in chaos runs: the
    old port of a restarted client, still in some peer's passive view) must not move that
    node in our address book: everything sent to it would go to a dead port."""
    async with started_nodes(2, gossip_config=SPARSE) as nodes:
        target, victim = nodes
        target.add_peer_addresses([victim.address])
        before = target.transport.known_address(victim.node_id)
        attacker = Transport(Identity.generate(), NodeConfig.loopback())
        await attacker.start()
        try:
            attacker.add_peer_address(target.address)
            connection = await attacker.connect(target.node_id, GOSSIP_ALPN)
            stream = await connection.open_bi()
            send, recv = stream.send(), stream.recv()
            forged = PeerAddress(victim.node_id, ("127.0.0.1:9",)).to_string()
            hello = {"topic": target.gossip.subscribe(RUN).topic.hex(), "address": forged}
            await send.write_all(framing.encode_frame(encode_control(FrameKind.HELLO, hello)))
            await asyncio.wait_for(framing.read_frame(recv, 1 << 16), 5)
            assert target.transport.known_address(victim.node_id) == before
            # The sender's own address, on its authenticated connection, is taken as given.
            own = attacker.address
            hello = {"topic": target.gossip.subscribe(RUN).topic.hex(),
                     "address": own.to_string()}
            stream = await connection.open_bi()
            send2, recv2 = stream.send(), stream.recv()
            await send2.write_all(framing.encode_frame(encode_control(FrameKind.HELLO, hello)))
            await asyncio.wait_for(framing.read_frame(recv2, 1 << 16), 5)
            assert target.transport.known_address(attacker.node_id) == own
        finally:
            await attacker.stop()
