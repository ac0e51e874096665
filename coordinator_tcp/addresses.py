"""The p2p address map a TCP coordinator sends its clients: full once, then changes.

The server (`AddressBook`) keeps the address each client joined with, drops those of
clients that are neither connected nor in the epoch (listed or exited), and numbers
every change it broadcasts: a connection's first state (and one answering
`ResyncAddresses`) carries the whole map as last broadcast (`addresses_full`), every
later state only what changed since the one before (`p2p_addresses` added or changed,
`p2p_removed`) and the number of the map it leads to (`addresses_seq`, one more than
the previous when something changed, the same when nothing did).

A receiver (`AddressMirror`) applies them in order; one that finds a gap (a change that
does not follow the map it holds) asks for the whole map again and, until it comes,
keeps the best map it can make.

    book = AddressBook(loaded)              # server
    book.set(key, address)
    changed, removed = book.commit(keep)    # at each broadcast; book.sent / book.version

    mirror = AddressMirror()                # client
    if mirror.apply(update):                # a gap: ask for the whole map
        await connection.send(ResyncAddresses())
    mirror.addresses
"""

from __future__ import annotations

from collections.abc import Collection

from coordinator_tcp.protocol import StateUpdate


class AddressBook:
    """The server's map, hex identity -> p2p address, and the numbered map last sent."""

    def __init__(self, addresses: dict[str, str] | None = None):
        self.addresses: dict[str, str] = dict(addresses or {})  # current (what is saved)
        # As of the last broadcast, numbered `version`. A map loaded after a restart
        # counts as sent: the clients reconnecting get it whole at once.
        self.sent: dict[str, str] = dict(self.addresses)
        self.version = 1 if self.sent else 0

    def get(self, key: str) -> str | None:
        return self.addresses.get(key)

    def set(self, key: str, address: str) -> None:
        self.addresses[key] = address

    def prune(self, keep: Collection[str]) -> None:
        """Forget every address whose key is not in `keep`."""
        if any(key not in keep for key in self.addresses):
            self.addresses = {k: v for k, v in self.addresses.items() if k in keep}

    def commit(self, keep: Collection[str]) -> tuple[dict[str, str], list[str]]:
        """Prune to `keep` and make the current map the sent one: the changes since the
        previous (added or changed, removed); `version` moves on when there are any."""
        self.prune(keep)
        changed = {k: v for k, v in self.addresses.items() if self.sent.get(k) != v}
        removed = [k for k in self.sent if k not in self.addresses]
        if changed or removed:
            self.version += 1
            self.sent = dict(self.addresses)
        return changed, removed


class AddressMirror:
    """A receiver's copy of the server's map, kept by applying each StateUpdate."""

    def __init__(self) -> None:
        self.addresses: dict[str, str] = {}
        self.version: int | None = None  # None: no whole map yet (or a gap since)
        self.asked = False  # a ResyncAddresses is on its way
        self.gaps = 0  # gaps found

    def reset(self) -> None:
        """A new connection: its first state brings the whole map."""
        self.version, self.asked = None, False

    def apply(self, update: StateUpdate) -> bool:
        """Apply `update`; True when the map held is not the server's and the whole map
        must be asked for (send `ResyncAddresses`; True once per gap). The changes are
        applied in any case, best effort until the whole map comes."""
        seq = update.addresses_seq
        if update.addresses_full:
            self.addresses = dict(update.p2p_addresses)
            self.version, self.asked = seq, False
            return False
        changes = bool(update.p2p_addresses or update.p2p_removed)
        follows = self.version is not None and (
            seq == self.version + 1 if changes else seq == self.version)
        self.addresses.update(update.p2p_addresses)
        for key in update.p2p_removed:
            self.addresses.pop(key, None)
        if follows:
            self.version = seq
            return False
        if self.version is not None:
            self.gaps += 1
        self.version = None
        ask, self.asked = not self.asked, True
        return ask
