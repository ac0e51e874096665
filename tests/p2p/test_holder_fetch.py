"""Results fetched from any holder: redirects, verification by hash, lying holders skipped."""

from __future__ import annotations

import asyncio
import os

import pytest

from client_image.p2p import (
    BlobStore,
    HolderBook,
    HolderPolicy,
    P2PNode,
    blob_hash,
    fetch_from_holders,
)
from client_image.p2p.blobs import RESPONSE_HEADER, STATUS_REDIRECT

from .swarm import started_nodes
from .test_blobs import fake_provider

pytestmark = pytest.mark.timeout(90)

RESULT_BYTES = 6338  # a tiny-llama DisTrO result's size


def test_a_holder_serves_its_budget_then_redirects_to_the_least_used_holders() -> None:
    book = HolderBook(HolderPolicy(serve_budget=2, max_active=2, redirect_fanout=2))
    digest, asker = bytes(32), b"\x09" * 32
    with book.uploading(digest), book.uploading(digest):
        # two uploads running and nobody known to hold it yet: busy, not a third upload
        assert book.decide(digest, asker) == "busy"
    book.served(digest, b"\x01" * 32, 10, now_holds=True)
    book.served(digest, b"\x02" * 32, 10, now_holds=True)
    first = book.decide(digest, asker)
    assert isinstance(first, list) and sorted(first) == [b"\x01" * 32, b"\x02" * 32]
    book.learn(digest, [b"\x07" * 32])  # a hint for our own download, never a redirect
    book.served(digest, b"\x03" * 32, 10, now_holds=True)
    # the two already pointed to once; the new holder is chosen before either again
    second = book.decide(digest, asker)
    assert isinstance(second, list) and second[0] == b"\x03" * 32
    assert book.decide(digest, b"\x01" * 32) != [b"\x01" * 32]  # never sent to itself
    book.forget_holder(digest, b"\x03" * 32)
    assert b"\x03" * 32 not in book.holders_of(digest)
    book.retain(lambda d: d != digest)
    assert book.holders_of(digest) == [] and book.stats.uploads == 3
    assert all(b"\x07" * 32 not in d for d in (first, second) if isinstance(d, list))


def test_the_book_stays_bounded() -> None:
    book = HolderBook(HolderPolicy(max_blobs=3, max_holders=4, redirect_fanout=2))
    for index in range(10):
        book.learn(bytes([index]) * 32, [bytes([i]) * 32 for i in range(10)])
    assert book.holders_of(bytes([0]) * 32) == []  # evicted, least recently used
    assert len(book.holders_of(bytes([9]) * 32)) == 4
    with pytest.raises(ValueError, match="at least 1"):
        HolderPolicy(serve_budget=0)


class WrongBytesBlobStore(BlobStore):
    """Fake for a malicious peer: stores what it is given, serves it with one bit flipped."""

    def get(self, digest: bytes) -> bytes | None:
        data = super().get(digest)
        return None if data is None else bytes([data[0] ^ 1]) + data[1:]


def _lie(node: P2PNode) -> None:
    node.blob_store = node.blobs.store = WrongBytesBlobStore()


async def _download(node: P2PNode, digest: bytes, producer: P2PNode,
                    everyone: list[P2PNode]) -> tuple[bytes, bytes | None]:
    others = [n.node_id for n in everyone if n is not node]
    data, provider = await fetch_from_holders(node.blobs, digest, RESULT_BYTES,
                                              producer.node_id, others)
    node.blob_store.add(data, tag="downloaded-result_1")  # serve it on, as IrohPeers does
    return data, provider


async def test_a_result_comes_from_a_non_producer_holder_verified_and_a_liar_is_skipped() -> None:
    payload = os.urandom(RESULT_BYTES)
    async with started_nodes(4) as nodes:
        producer, liar, honest, late = nodes
        for node in nodes:
            node.add_peer_addresses([other.address for other in nodes])
        _lie(liar)
        digest = producer.blob_store.add(payload, tag="result_1")
        # the producer's budget (2) goes to the liar and the honest holder
        for holder in (liar, honest):
            data, provider = await _download(holder, digest, producer, nodes)
            assert data == payload and provider == producer.node_id
        assert producer.blobs.holders.stats.uploads == 2
        # the late node prefers the liar (it was fast before): wrong bytes, skipped
        late.blobs.holders.record_fetch(liar.node_id, 0.001)
        late.blobs.holders.record_fetch(honest.node_id, 5.0)
        data, provider = await _download(late, digest, producer, nodes)
        assert data == payload and blob_hash(data) == digest
        assert provider == honest.node_id
        assert producer.blobs.holders.stats.uploads == 2  # it redirected instead
        assert producer.blobs.holders.stats.redirects >= 1
        assert liar.node_id not in late.blobs.holders.holders_of(digest)
        assert liar.blobs.holders.stats.uploads == 1  # it did serve its wrong bytes
        # an asker that accepts no redirect (an older client) is still served
        assert await late.blobs.download(digest, RESULT_BYTES, [producer.node_id]) == payload


async def test_a_swarm_fetches_one_result_uploading_it_about_twice_from_its_producer() -> None:
    payload = os.urandom(RESULT_BYTES)
    async with started_nodes(10) as nodes:
        producer = nodes[0]
        for node in nodes:
            node.add_peer_addresses([other.address for other in nodes])
        digest = producer.blob_store.add(payload, tag="result_1")
        got = await asyncio.gather(*(_download(n, digest, producer, nodes) for n in nodes[1:]))
        assert all(data == payload for data, _ in got)
        assert producer.blobs.holders.stats.uploads <= 3
        assert sum(n.blobs.holders.stats.uploads for n in nodes) == len(nodes) - 1
        assert max(n.blobs.holders.stats.uploads for n in nodes) <= 2


MADE_UP_IDS = os.urandom(64)


@pytest.mark.parametrize("answer", [
    RESPONSE_HEADER.pack(STATUS_REDIRECT, 99),  # more holders than allowed: a protocol error
    RESPONSE_HEADER.pack(STATUS_REDIRECT, 2) + MADE_UP_IDS,  # ids of no run member: not dialled
], ids=["too-many-holders", "unknown-holders"])
async def test_a_bad_redirect_is_skipped_and_the_producer_serves(answer: bytes) -> None:
    payload = os.urandom(RESULT_BYTES)
    async with (
        fake_provider(lambda d, o: answer) as bogus,
        started_nodes(2) as (producer, downloader),
    ):
        downloader.add_peer_addresses([bogus.address, producer.address])
        digest = producer.blob_store.add(payload, tag="result_1")
        downloader.blobs.holders.learn(digest, [bogus.node_id])  # asked first: known holder
        data, provider = await fetch_from_holders(
            downloader.blobs, digest, RESULT_BYTES, producer.node_id)
        assert data == payload and provider == producer.node_id
        learned = downloader.blobs.holders.holders_of(digest)
        assert MADE_UP_IDS[:32] not in learned and MADE_UP_IDS[32:] not in learned
        if len(answer) == RESPONSE_HEADER.size:  # count 99: the bogus peer is forgotten
            assert bogus.node_id not in learned
