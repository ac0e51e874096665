"""Endpoint options, address exchange, diagnostics, and robustness against junk peers."""

import asyncio
import os
import sys
import time
from pathlib import Path

import iroh
import pytest

from client_image.p2p import BLOBS_ALPN, GOSSIP_ALPN, NodeConfig, P2PNode, PeerAddress
from client_image.p2p.blobs import BlobDownloadError
from client_image.p2p.transport import Transport, TransportError, interface_ipv4
from psyche_common.identity import Identity

from .swarm import started_nodes, wait_until

pytestmark = pytest.mark.timeout(60)
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bind_port": 70000}, "bind_port"),
        ({"relay_mode": "sometimes"}, "relay_mode"),
        ({"relay_mode": "custom"}, "at least one relay URL"),
    ],
)
def test_bad_node_config_is_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NodeConfig(**kwargs)  # type: ignore[arg-type]  # deliberately invalid settings


def test_interface_resolution() -> None:
    assert interface_ipv4("lo*") == "127.0.0.1"
    with pytest.raises(ValueError, match="no network interface matching"):
        interface_ipv4("no-such-interface*")


async def test_fixed_port_and_interface_binding() -> None:
    config = NodeConfig(bind_interface="lo", bind_port=0, relay_mode="disabled")
    async with P2PNode(config=config) as node:
        port = int(node.address.direct_addresses[0].rsplit(":", 1)[1])
    async with P2PNode(
        config=NodeConfig(bind_ip="127.0.0.1", bind_port=port, relay_mode="disabled")
    ) as node:
        assert node.address.direct_addresses == (f"127.0.0.1:{port}",)
        assert PeerAddress.parse(node.address.to_string()) == node.address


async def test_addresses_from_the_client_list_and_diagnostics() -> None:
    async with started_nodes(2) as (a, b):
        learned = b.add_peer_addresses([a.address.to_string()])
        assert learned[0].node_id == a.node_id
        data = os.urandom(500_000)
        digest = a.blob_store.add(data)
        assert await b.blobs.download(digest, len(data), [a.node_id]) == data
        (seen_by_b,) = b.diagnostics()
        assert seen_by_b.peer == a.node_id and seen_by_b.connection_type == "direct"
        assert seen_by_b.remote_address == a.address.direct_addresses[0]
        assert seen_by_b.bytes_received > len(data) > seen_by_b.bytes_sent > 0
        await wait_until(lambda: len(a.diagnostics()) == 1, what="the server side to see the peer")
        assert a.diagnostics()[0].peer == b.node_id
        assert a.diagnostics()[0].bytes_sent > len(data)


async def test_unknown_or_unreachable_peer_fails_fast_and_clearly() -> None:
    async with started_nodes(1) as (node,):
        ghost = PeerAddress(os.urandom(32), ("127.0.0.1:9",))
        node.add_peer_addresses([ghost])
        with pytest.raises(TransportError, match="cannot connect"):
            await node.transport.connect(ghost.node_id, BLOBS_ALPN)
        with pytest.raises(TransportError, match="unreachable moments ago"):
            await node.transport.connect(ghost.node_id, BLOBS_ALPN)
    with pytest.raises(TransportError, match="not started"):
        await Transport(node.identity).connect(ghost.node_id, BLOBS_ALPN)


async def test_junk_on_our_alpns_never_takes_the_node_down() -> None:
    async with started_nodes(2) as (server, client):
        client.add_peer_addresses([server.address])
        for alpn in (GOSSIP_ALPN, BLOBS_ALPN, b"psyche/model-sharing/0"):
            connection = await client.transport.connect(server.node_id, alpn)
            stream = await connection.open_bi()
            await stream.send().write_all(b"\xff" * 64 + b"garbage that is no request")
            await stream.send().finish()
            await asyncio.wait_for(stream.recv().read_to_end(1 << 16), 5)
            client.transport.drop_connection(server.node_id, alpn)
        with pytest.raises(TransportError):  # an ALPN nobody serves is refused
            await client.transport.connect(server.node_id, b"unknown/0")
        # still healthy afterwards
        data = b"still serving"
        digest = server.blob_store.add(data)
        assert await client.blobs.download(digest, len(data), [server.node_id]) == data
        assert server.transport.running
        assert isinstance(server.transport._endpoint, iroh.Endpoint)


async def _blob_peer(secret_hex: str, *fetch_from: str
                     ) -> tuple[asyncio.subprocess.Process, str, bytes]:
    extra = ["--fetch-from", *fetch_from] if fetch_from else []
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.p2p.blob_peer_process", secret_hex, *extra,
        stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT)
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    address, digest = line.decode().split()
    return process, address, bytes.fromhex(digest)


async def test_a_peer_killed_and_restarted_on_a_new_port_is_reached_at_once() -> None:
    """A SIGKILLed peer closes nothing: our pooled connection to it would stall requests
    until QUIC's idle timeout, and a cached dial failure would refuse its new address.
    Learning the new address (as from the coordinator's client list) must drop both."""
    secret = os.urandom(32).hex()
    peer_id = Identity.from_hex(secret).public_key
    async with P2PNode(config=NodeConfig.loopback()) as node:
        process, address, digest = await _blob_peer(secret)
        try:
            node.add_peer_addresses([PeerAddress(peer_id, (address,))])
            assert len(await node.blobs.download(digest, 6338, [peer_id])) == 6338
            process.kill()
            await process.wait()
            with pytest.raises(BlobDownloadError):  # dead: fails, and caches the failure
                await node.blobs.download(digest, 6338, [peer_id])
            process, new_address, digest = await _blob_peer(secret)
            assert new_address != address
            node.add_peer_addresses([PeerAddress(peer_id, (new_address,))])
            # Another peer still gossips the corpse's address: a hint never replaces the
            # coordinator's (it once sent every download to the dead port for a whole round).
            node.transport.add_peer_address(PeerAddress(peer_id, (address,)), hint=True)
            assert node.transport.known_address(peer_id) == PeerAddress(peer_id, (new_address,))
            started = time.monotonic()
            assert len(await node.blobs.download(digest, 6338, [peer_id])) == 6338
            assert time.monotonic() - started < 2.0  # not the 10 s read timeout on the corpse
        finally:
            process.kill()
            await process.wait()


async def test_a_restarted_peer_that_dialed_us_first_is_reached_at_once() -> None:
    """As in a chaos run: the restarted client dials its peers (downloading their results)
    before they learn its new address. iroh (1.2) then never completed our dials to it
    while its connections to us stayed open: every download from it timed out for a
    whole round. Learning the new address closes them; the peer redials, we dial."""
    secret = os.urandom(32).hex()
    peer_id = Identity.from_hex(secret).public_key
    async with P2PNode(config=NodeConfig.loopback()) as node:
        ours = node.blob_store.add(bytes(100))
        fetch = (node.address.to_string(), ours.hex(), "100")
        process, address, digest = await _blob_peer(secret, *fetch)
        try:
            node.add_peer_addresses([PeerAddress(peer_id, (address,))])
            assert len(await node.blobs.download(digest, 6338, [peer_id])) == 6338
            for _restart in range(3):
                process.kill()
                await process.wait()
                process, address, digest = await _blob_peer(secret, *fetch)
                await asyncio.sleep(1.0)  # it dials us first
                node.add_peer_addresses([PeerAddress(peer_id, (address,))])
                started = time.monotonic()
                assert len(await node.blobs.download(digest, 6338, [peer_id])) == 6338
                assert time.monotonic() - started < 2.0
        finally:
            process.kill()
            await process.wait()


def test_a_gossiped_address_only_fills_in_an_unknown_peer() -> None:
    transport = P2PNode(config=NodeConfig.loopback()).transport
    known, other = Identity.generate().public_key, Identity.generate().public_key
    transport.add_peer_address(PeerAddress(known, ("127.0.0.1:4000",)))
    transport.add_peer_address(PeerAddress(known, ("127.0.0.1:4001",)), hint=True)
    transport.add_peer_address(PeerAddress(other, ("127.0.0.1:5000",)), hint=True)
    assert transport.known_address(known) == PeerAddress(known, ("127.0.0.1:4000",))
    assert transport.known_address(other) == PeerAddress(other, ("127.0.0.1:5000",))
    # The coordinator's word replaces both.
    transport.add_peer_address(PeerAddress(known, ("127.0.0.1:4002",)))
    transport.add_peer_address(PeerAddress(other, ("127.0.0.1:5002",)))
    assert transport.known_address(known) == PeerAddress(known, ("127.0.0.1:4002",))
    assert transport.known_address(other) == PeerAddress(other, ("127.0.0.1:5002",))
