"""What the TCP coordinator server sends every connection when the state changes.

`StateBroadcaster` turns a new encoded state into the two messages of one broadcast: for
the clients, a patch from the previous broadcast (`coordinator_tcp.state_delta`) with the
address changes since then (`coordinator_tcp.addresses`); for the observers, the state
whole with `joined`. It also makes a connection's first state and the answer to
`ResyncAddresses` (the state and the address map whole, as last broadcast).

`fan_out` writes one broadcast to every connection. The frame is made once, not once
per connection, and written straight to each transport: with a thousand clients, the
broadcast is a thousand `send` calls and little else (on loopback about 9 us each, the
receiver's side of TCP included), so the last client has it about 10 ms after the first.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterable

from coordinator import CoordinatorState, encode_state
from coordinator_tcp.addresses import AddressBook
from coordinator_tcp.connections import Peer
from coordinator_tcp.protocol import StateUpdate
from coordinator_tcp.state_delta import StateDeltas
from psyche_common.tcp.framing import encode_frame


class StateBroadcaster:
    """The numbered state and address map as last broadcast, and the messages that move
    the clients from one broadcast to the next."""

    def __init__(self, addresses: AddressBook, now: Callable[[], int]):
        self.addresses = addresses
        self.deltas = StateDeltas()  # the last broadcast state, numbered
        self.now = now

    @property
    def seq(self) -> int:
        return self.deltas.seq

    def is_current(self, encoded: bytes) -> bool:
        """Whether `encoded` is the state last broadcast (nothing to send)."""
        return encoded == self.deltas.current

    def whole(self, state: CoordinatorState, *, joined: int | None = None) -> bytes:
        """The state with the whole address map as last broadcast (a connection's first
        state, the answer to ResyncAddresses); `joined` for an observer."""
        encoded = encode_state(state)
        # Numbered only if it is the last broadcast, the base of the next patch; else the
        # receiver finds the next patch a gap and asks again (it changed in between).
        seq = self.deltas.seq if self.is_current(encoded) else 0
        return StateUpdate(
            state=base64.b64encode(encoded).decode(), state_seq=seq,
            p2p_addresses=self.addresses.sent, addresses_seq=self.addresses.version,
            addresses_full=True, server_time=self.now(), sent_at=time.time(),
            joined=joined).to_frame()

    def advance(self, encoded: bytes, address_keys: set[str],
                joined: int) -> tuple[bytes, bytes]:
        """The broadcast of the new state `encoded`, keeping the addresses of
        `address_keys`: for the clients (a patch from the previous state, whole only if
        there was none) and for the observers (whole, with `joined`)."""
        changed, removed = self.addresses.commit(address_keys)
        seq, patch, digest = self.deltas.advance(encoded)
        whole = base64.b64encode(encoded).decode()
        update = StateUpdate(
            state="" if patch else whole, state_seq=seq, state_delta=patch or "",
            state_digest=digest, p2p_addresses=changed, p2p_removed=removed,
            addresses_seq=self.addresses.version, server_time=self.now(), sent_at=time.time())
        observed = update.model_copy(update={"state": whole, "state_delta": "",
                                             "joined": joined})
        return update.to_frame(), observed.to_frame()

    def joined_changed(self, state: CoordinatorState, joined: int) -> bytes:
        """For the observers: the same state, with a new count of clients asking to join."""
        return StateUpdate(
            state=base64.b64encode(encode_state(state)).decode(), state_seq=self.deltas.seq,
            addresses_seq=self.addresses.version, server_time=self.now(),
            sent_at=time.time(), joined=joined).to_frame()


def fan_out(peers: Iterable[Peer], payload: bytes,
            observer_payload: bytes | None = None) -> list[Peer]:
    """Write `payload` to each of `peers` (`observer_payload`, if given, to the observers);
    the peers too far behind to take it, which the caller disconnects."""
    frame = encode_frame(payload)
    observer_frame = encode_frame(observer_payload) if observer_payload else frame
    return [peer for peer in peers
            if not peer.send_frame(observer_frame if peer.observer else frame)]
