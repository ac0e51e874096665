"""The p2p address string a client publishes in the coordinator's client list.

Format (one line, no spaces)::

    <node id: 64 hex digits>@<ip:port>,<ip:port>,...[;relay=<url>]

e.g. ``5f0c...e1@192.0.2.7:4455,[2001:db8::7]:4455;relay=https://relay.example``.
Direct addresses may be empty (``<id>@`` with a relay, or learned later).
It is a readable form of iroh's ``EndpointAddr(id, relay_url, direct_addresses)``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

MAX_ADDRESS_STRING = 2048
MAX_DIRECT_ADDRESSES = 16


class AddressError(ValueError):
    """A peer address string that does not follow the documented format."""


def _check_socket_address(text: str) -> str:
    host, separator, port_text = text.rpartition(":")
    if not separator or not host:
        raise AddressError(f"direct address {text!r} is not ip:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise AddressError(f"direct address {text!r} does not start with an IP address") from None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise AddressError(f"direct address {text!r} has no valid port")
    return text


def parse_node_id(text: str) -> bytes:
    """32-byte node id from its 64-digit hex form."""
    if len(text) != 64:
        raise AddressError(f"node id must be 64 hex digits, got {len(text)} characters")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise AddressError(f"node id {text!r} is not hexadecimal") from None


@dataclass(frozen=True)
class PeerAddress:
    node_id: bytes
    direct_addresses: tuple[str, ...] = ()
    relay_url: str | None = None

    def __post_init__(self) -> None:
        if len(self.node_id) != 32:
            raise AddressError(f"node id must be 32 bytes, got {len(self.node_id)}")
        if len(self.direct_addresses) > MAX_DIRECT_ADDRESSES:
            raise AddressError(
                f"at most {MAX_DIRECT_ADDRESSES} direct addresses, got {len(self.direct_addresses)}"
            )
        for address in self.direct_addresses:
            _check_socket_address(address)

    def to_string(self) -> str:
        text = f"{self.node_id.hex()}@{','.join(self.direct_addresses)}"
        if self.relay_url:
            text += f";relay={self.relay_url}"
        return text

    @classmethod
    def parse(cls, text: str) -> PeerAddress:
        if not isinstance(text, str):
            raise AddressError(f"peer address must be a string, got {type(text).__name__}")
        if len(text) > MAX_ADDRESS_STRING:
            raise AddressError(f"peer address longer than {MAX_ADDRESS_STRING} characters")
        node_part, at, rest = text.strip().partition("@")
        if not at:
            raise AddressError(f"peer address {text[:80]!r} has no '@' after the node id")
        node_id = parse_node_id(node_part)
        addresses_part, _, options = rest.partition(";")
        relay_url = None
        if options:
            key, equals, value = options.partition("=")
            if key != "relay" or not equals or not value:
                raise AddressError(f"peer address option {options!r} is not relay=<url>")
            relay_url = value
        addresses = tuple(a for a in addresses_part.split(",") if a)
        return cls(node_id, addresses, relay_url)
