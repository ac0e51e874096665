"""Account changes pushed over Solana's PubSub WebSocket (`accountSubscribe`), with
fallbacks: the next WebSocket endpoint (WS_RPC_2), and slow polling over JSON-RPC while
no WebSocket answers, then reconnection with exponential backoff.

    subscription = AccountSubscription(rpc, [WS_RPC, WS_RPC_2], address)
    async for data in subscription.changes():   # the account's bytes, each time they change
        ...

On each (re)connection the account is read once over JSON-RPC, so a change made while
the socket was down is not missed. `default_ws_url` derives WS_RPC from RPC as Solana's
tools do (http -> ws, https -> wss, port + 1).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit, urlunsplit

from solders.pubkey import Pubkey
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidURI, WebSocketException

from psyche_solana.rpc import RpcError, SolanaRpc

log = logging.getLogger(__name__)
MAX_NOTIFICATION_BYTES = 16 * 1024 * 1024  # a 10 MiB account, base64, with its envelope


class SubscriptionRefused(Exception):
    """The server answered accountSubscribe with an error (the message is its)."""


def default_ws_url(rpc_url: str) -> str:
    """The PubSub URL of a JSON-RPC URL, by Solana's rule: ws(s) scheme, port + 1."""
    parts = urlsplit(rpc_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    netloc = parts.netloc
    if parts.port is not None:
        netloc = f"{netloc.rsplit(':', 1)[0]}:{parts.port + 1}"
    return urlunsplit((scheme, netloc, parts.path, parts.query, parts.fragment))


def ws_urls_for(rpc_urls: Sequence[str | None], ws_urls: Sequence[str | None]) -> list[str]:
    """WS_RPC, WS_RPC_2…: each given one, else the one derived from the RPC URL beside it."""
    out = []
    for index, rpc_url in enumerate(rpc_urls):
        given = ws_urls[index] if index < len(ws_urls) else None
        if given:
            out.append(given)
        elif rpc_url:
            out.append(default_ws_url(rpc_url))
    return out


def _decode_notification(message: str | bytes, subscription_id: int) -> bytes | None:
    """The account data of an accountNotification for this subscription; None for any
    other message. Raises ValueError for a notification that is malformed."""
    body = json.loads(message)
    if not isinstance(body, dict) or body.get("method") != "accountNotification":
        return None
    params = body.get("params")
    if not isinstance(params, dict) or params.get("subscription") != subscription_id:
        return None
    try:
        value = params["result"]["value"]
        if value is None:
            return b""
        encoded, encoding = value["data"]
        if encoding != "base64":
            raise ValueError(f"data encoded as {encoding!r}, asked for base64")
        return base64.b64decode(encoded, validate=True)
    except (KeyError, TypeError, binascii.Error) as exc:
        raise ValueError(f"malformed accountNotification: {exc!r}") from None


class AccountSubscription:
    """One account, followed over the first WebSocket endpoint that answers.

    `fallback_poll_s`: how often the account is read over JSON-RPC while no WebSocket
    answers (slower than the old 4 Hz polling: it is a fallback). `poll_slice`: read
    only this part of the account while polling (the coordinator's nonce) and the whole
    account when it changed.
    """

    def __init__(self, rpc: SolanaRpc, ws_urls: Sequence[str | None], address: Pubkey, *,
                 fallback_poll_s: float = 1.0, backoff_s: float = 0.25,
                 max_backoff_s: float = 8.0, open_timeout_s: float = 5.0,
                 poll_slice: dict[str, int] | None = None):
        self.rpc, self.address = rpc, address
        self.ws_urls = [url for url in ws_urls if url]
        self.fallback_poll_s, self.open_timeout_s = fallback_poll_s, open_timeout_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.poll_slice = poll_slice
        self.connected = asyncio.Event()       # set while a subscription is live
        self.notifications = 0                 # account notifications received (tests, logs)
        self._last: bytes | None = None
        self._last_slice: bytes | None = None

    def _changed(self, data: bytes | None) -> bytes | None:
        if data is None or data == self._last:
            return None
        self._last = data
        return data

    async def changes(self) -> AsyncIterator[bytes]:
        """The account's data now (when it exists) and after each change; forever."""
        delay = self.backoff_s
        while True:
            for url in self.ws_urls:
                try:
                    async with connect(url, open_timeout=self.open_timeout_s,
                                       max_size=MAX_NOTIFICATION_BYTES, compression=None) as ws:
                        subscription_id = await self._subscribe(ws)
                        self.connected.set()
                        delay = self.backoff_s
                        log.info("subscribed to %s at %s", self.address, url)
                        if (data := self._changed(await self.rpc.account_data(self.address))):
                            yield data   # what changed while no subscription was live
                        async for message in ws:
                            if (data := self._changed(self._notified(message, subscription_id))):
                                yield data
                except (OSError, TimeoutError, WebSocketException, InvalidURI,
                        SubscriptionRefused, RpcError) as exc:
                    log.warning("account subscription at %s: %s", url, exc or type(exc).__name__)
                finally:
                    self.connected.clear()
            # No WebSocket answers: poll slowly until it is time to try them again.
            deadline = time.monotonic() + delay
            while True:
                if (data := self._changed(await self._poll())):
                    yield data
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await asyncio.sleep(min(self.fallback_poll_s, left))
            delay = min(delay * 2, self.max_backoff_s)

    async def _subscribe(self, ws: ClientConnection) -> int:
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "accountSubscribe",
                                  "params": [str(self.address),
                                             {"encoding": "base64", "commitment": "confirmed"}]}))
        async with asyncio.timeout(self.open_timeout_s):
            while True:  # the answer comes first: a notification needs its id
                try:
                    answer = json.loads(await ws.recv())
                except ValueError:
                    raise SubscriptionRefused("the answer to accountSubscribe is not JSON") from None
                if not isinstance(answer, dict) or answer.get("id") != 1:
                    continue
                if "error" in answer:
                    error = answer["error"]
                    raise SubscriptionRefused(f"accountSubscribe refused: "
                                              f"{error.get('message', error) if isinstance(error, dict) else error}")
                if not isinstance(answer.get("result"), int):
                    raise SubscriptionRefused(f"accountSubscribe answered {answer!r}")
                return int(answer["result"])

    def _notified(self, message: str | bytes, subscription_id: int) -> bytes | None:
        try:
            data = _decode_notification(message, subscription_id)
        except ValueError as exc:  # a broken server's message: skip it, keep the socket
            log.warning("account subscription: %s", exc)
            return None
        if data is not None:
            self.notifications += 1
        return data

    async def _poll(self) -> bytes | None:
        try:
            if self.poll_slice is not None:
                part = await self.rpc.account_data(self.address, self.poll_slice)
                if part is None or (part == self._last_slice and self._last is not None):
                    return None
                self._last_slice = part
            return await self.rpc.account_data(self.address)
        except RpcError as exc:
            log.warning("polling %s: %s", self.address, exc)
            return None
