"""One iroh endpoint per node: binding options, ALPN dispatch, pooled connections.

Higher layers (gossip, blobs, model sharing) register a handler per ALPN and
dial peers by node id; the transport keeps one connection per (peer, ALPN),
remembers the direct addresses learned from the coordinator's client list, and
reports per-peer connection diagnostics.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import fnmatch
import logging
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import iroh
from iroh import iroh_ffi

from client_image.p2p.address import PeerAddress
from client_image.p2p.diagnostics import PeerDiagnostics, snapshot_connection
from psyche_common.identity import Identity

logger = logging.getLogger(__name__)

ProtocolHandler = Callable[[iroh.Connection], Awaitable[None]]
RelayModeName = Literal["disabled", "default", "custom"]


class TransportError(RuntimeError):
    """A peer could not be reached or the endpoint is not running."""


@dataclass(frozen=True)
class NodeConfig:
    """How the endpoint binds and which relays it uses.

    ``bind_interface`` (e.g. ``"eth*"``, fnmatch pattern) wins over ``bind_ip``
    when set; tests use ``bind_ip="127.0.0.1"`` with relays disabled.
    """

    bind_ip: str = "0.0.0.0"
    bind_port: int = 0
    bind_interface: str | None = None
    relay_mode: RelayModeName = "default"
    relay_urls: tuple[str, ...] = ()
    connect_timeout_s: float = 5.0
    # After a failed dial, further dials to that peer fail at once for this long, so many
    # concurrent requests to a dead peer do not queue up one connect timeout each.
    dial_failure_cache_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 <= self.bind_port < 65536:
            raise ValueError(f"bind_port must be in 0..65535, got {self.bind_port}")
        if self.relay_mode not in ("disabled", "default", "custom"):
            raise ValueError(
                f"relay_mode must be disabled, default or custom, got {self.relay_mode!r}"
            )
        if self.relay_mode == "custom" and not self.relay_urls:
            raise ValueError("relay_mode 'custom' needs at least one relay URL")

    @classmethod
    def loopback(cls, connect_timeout_s: float = 5.0) -> NodeConfig:
        return cls(bind_ip="127.0.0.1", relay_mode="disabled", connect_timeout_s=connect_timeout_s)


def interface_ipv4(pattern: str) -> str:
    """IPv4 address of the first network interface whose name matches ``pattern``."""
    SIOCGIFADDR = 0x8915  # Linux ioctl: get an interface's address
    for _, name in socket.if_nameindex():
        if not fnmatch.fnmatch(name, pattern):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                request = struct.pack("256s", name.encode()[:15])
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue  # interface without an IPv4 address
            return socket.inet_ntoa(reply[20:24])
    raise ValueError(f"no network interface matching {pattern!r} has an IPv4 address")


def _relay_mode(config: NodeConfig) -> iroh.RelayMode:
    if config.relay_mode == "disabled":
        return iroh.RelayMode.disabled()
    if config.relay_mode == "custom":
        return iroh.RelayMode.custom_from_urls(list(config.relay_urls))
    return iroh.RelayMode.default_mode()


@dataclass
class _PeerBook:
    addresses: dict[bytes, PeerAddress] = field(default_factory=dict)

    def endpoint_addr(self, node_id: bytes) -> iroh.EndpointAddr:
        known = self.addresses.get(node_id)
        direct = list(known.direct_addresses) if known else []
        relay = known.relay_url if known else None
        return iroh.EndpointAddr(iroh.EndpointId.from_bytes(node_id), relay, direct)


class Transport:
    """An iroh endpoint named by ``identity`` with ALPN dispatch and a connection pool."""

    def __init__(self, identity: Identity, config: NodeConfig | None = None) -> None:
        self.identity = identity
        self.config = config or NodeConfig()
        self._handlers: dict[bytes, ProtocolHandler] = {}
        self._endpoint: iroh.Endpoint | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._handler_tasks: set[asyncio.Task[None]] = set()
        self._outgoing: dict[tuple[bytes, bytes], iroh.Connection] = {}
        self._dial_locks: dict[tuple[bytes, bytes], asyncio.Lock] = {}
        self._dial_failed_at: dict[tuple[bytes, bytes], float] = {}
        self._incoming: list[iroh.Connection] = []
        self._peers = _PeerBook()

    # -- lifecycle -----------------------------------------------------------------
    def register_protocol(self, alpn: bytes, handler: ProtocolHandler) -> None:
        self._handlers[alpn] = handler
        if self._endpoint is not None:
            self._endpoint.set_alpns(list(self._handlers))

    async def start(self) -> None:
        if self._endpoint is not None:
            return
        # The uniffi binding runs its async calls on the asyncio loop registered here; it
        # must be registered before the first async iroh call.
        iroh_ffi.uniffi_set_event_loop(asyncio.get_running_loop())  # type: ignore[arg-type]  # uniffi stub says BaseEventLoop; it only stores the loop
        ip = (
            interface_ipv4(self.config.bind_interface)
            if self.config.bind_interface
            else self.config.bind_ip
        )
        builder = iroh.EndpointBuilder()
        builder.apply_minimal()
        builder.relay_mode(_relay_mode(self.config))
        builder.secret_key(self.identity.secret_key)
        builder.alpns(list(self._handlers))
        host = f"[{ip}]" if ":" in ip else ip
        builder.bind_addr(f"{host}:{self.config.bind_port}")
        self._endpoint = await builder.bind()
        self._accept_task = asyncio.create_task(self._accept_loop(), name="p2p-accept")

    async def stop(self) -> None:
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is None:
            return
        tasks = [t for t in [self._accept_task, *self._handler_tasks] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for connection in [*self._outgoing.values(), *self._incoming]:
            with contextlib.suppress(Exception):
                connection.close(0, b"node stopping")
        self._outgoing.clear()
        self._incoming.clear()
        with contextlib.suppress(Exception, asyncio.TimeoutError):
            await asyncio.wait_for(endpoint.close(), timeout=5.0)

    @property
    def running(self) -> bool:
        return self._endpoint is not None

    def _require_endpoint(self) -> iroh.Endpoint:
        if self._endpoint is None:
            raise TransportError("the p2p node is not started")
        return self._endpoint

    # -- addresses -------------------------------------------------------------------
    @property
    def node_id(self) -> bytes:
        return self.identity.public_key

    @property
    def address(self) -> PeerAddress:
        """This node's address; bound wildcard sockets are not dialable, so skip them."""
        sockets = self._require_endpoint().bound_sockets()
        direct = tuple(s for s in sockets if not s.startswith(("0.0.0.0:", "[::]:")))
        if not direct and self.config.bind_ip in ("0.0.0.0", "::"):
            direct = tuple(self._require_endpoint().addr().direct_addresses())
        return PeerAddress(self.node_id, direct[:16])

    def add_peer_address(self, address: PeerAddress, *, hint: bool = False) -> None:
        """Remember how to reach a peer. An address from the coordinator's client list (or
        the operator's bootstrap list) is authoritative: it replaces what we knew. A `hint`
        (an address another peer gossiped) is only used for a peer we know nothing about:
        it may be stale (the peer restarted on a new port since) or forged, and must never
        replace a good address or drop our connections to it."""
        if address.node_id == self.node_id:
            return
        known = self._peers.addresses.get(address.node_id)
        if hint and known is not None:
            return
        if known is None or address.direct_addresses or address.relay_url:
            self._peers.addresses[address.node_id] = address
        if known is not None and known.direct_addresses and address.direct_addresses and not (
                set(known.direct_addresses) & set(address.direct_addresses)):
            self._forget_connections(address.node_id)

    def known_address(self, node_id: bytes) -> PeerAddress | None:
        return self._peers.addresses.get(node_id)

    def _forget_connections(self, node_id: bytes) -> None:
        """The peer moved (a restarted process binds a new port): a pooled connection to
        its old incarnation would stall every request until QUIC's idle timeout, and a
        cached dial failure would refuse the new address; drop both so the next request
        dials the new one. Its connections *to us* go too, the old incarnation's and any
        the new one opened already: while they stay open, iroh (1.2) never completes our
        dials to the new incarnation (every dial timed out; tests/p2p/test_transport.py).
        The new incarnation's requests on them fail once and are retried on a new
        connection."""
        for key in [key for key in self._outgoing if key[0] == node_id]:
            self.drop_connection(*key)
        for key in [key for key in self._dial_failed_at if key[0] == node_id]:
            del self._dial_failed_at[key]
        for connection in self._incoming:
            if connection.remote_id().to_bytes() == node_id:
                with contextlib.suppress(Exception):
                    connection.close(0, b"you moved: dial again")

    # -- connections -------------------------------------------------------------------
    async def connect(self, node_id: bytes, alpn: bytes) -> iroh.Connection:
        """A live connection to ``node_id`` on ``alpn``: pooled, dialled on demand."""
        endpoint = self._require_endpoint()
        key = (node_id, alpn)
        lock = self._dial_locks.setdefault(key, asyncio.Lock())
        async with lock:
            existing = self._outgoing.get(key)
            if existing is not None and existing.close_reason() is None:
                return existing
            failed_at = self._dial_failed_at.get(key)
            if (
                failed_at is not None
                and time.monotonic() - failed_at < self.config.dial_failure_cache_s
            ):
                raise TransportError(f"{node_id.hex()[:10]} was unreachable moments ago")
            try:
                connection = await asyncio.wait_for(
                    endpoint.connect(self._peers.endpoint_addr(node_id), alpn),
                    timeout=self.config.connect_timeout_s,
                )
            except (TimeoutError, iroh.IrohError) as error:
                self._dial_failed_at[key] = time.monotonic()
                reason = (f"no answer within {self.config.connect_timeout_s}s"
                          if isinstance(error, TimeoutError)
                          else str(error) or type(error).__name__)
                raise TransportError(f"cannot connect to {node_id.hex()[:10]}: {reason}") from None
            self._dial_failed_at.pop(key, None)
            self._outgoing[key] = connection
            return connection

    def drop_connection(self, node_id: bytes, alpn: bytes) -> None:
        """Close a pooled connection so the next ``connect`` dials afresh."""
        connection = self._outgoing.pop((node_id, alpn), None)
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close(0, b"dropped")

    async def _accept_loop(self) -> None:
        endpoint = self._require_endpoint()
        while True:
            incoming = await endpoint.accept_next()
            if incoming is None:
                return  # endpoint closed
            task = asyncio.create_task(self._serve_incoming(incoming))
            self._handler_tasks.add(task)
            task.add_done_callback(self._handler_tasks.discard)

    async def _serve_incoming(self, incoming: iroh.Incoming) -> None:
        try:
            accepting = await asyncio.wait_for(incoming.accept(), timeout=10)
            alpn = await accepting.alpn()
            connection = await asyncio.wait_for(accepting.connect(), timeout=10)
        except (TimeoutError, iroh.IrohError) as error:
            logger.debug("incoming connection failed: %s", error)
            return
        handler = self._handlers.get(alpn)
        if handler is None:
            connection.close(1, b"unknown alpn")
            return
        self._incoming = [c for c in self._incoming if c.close_reason() is None]
        self._incoming.append(connection)
        try:
            await handler(connection)
        except asyncio.CancelledError:
            raise
        except Exception:  # a misbehaving peer must never take the node down
            logger.exception("handler for %r failed", alpn)
            with contextlib.suppress(Exception):
                connection.close(2, b"handler error")

    # -- diagnostics ---------------------------------------------------------------------
    def diagnostics(self) -> list[PeerDiagnostics]:
        """Per-peer snapshot over every open connection (all ALPNs, both directions)."""
        by_peer: dict[bytes, list[iroh.Connection]] = {}
        live_outgoing = [c for c in self._outgoing.values() if c.close_reason() is None]
        live_incoming = [c for c in self._incoming if c.close_reason() is None]
        for connection in [*live_outgoing, *live_incoming]:
            by_peer.setdefault(connection.remote_id().to_bytes(), []).append(connection)
        return [snapshot_connection(peer, conns) for peer, conns in sorted(by_peer.items())]
