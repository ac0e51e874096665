"""Solana's PubSub API over WebSocket for the local validator: `accountSubscribe` and
`accountUnsubscribe`, as a real validator serves them (on the JSON-RPC port + 1).

    -> {"jsonrpc":"2.0","id":1,"method":"accountSubscribe",
        "params":["<pubkey>",{"encoding":"base64","commitment":"confirmed"}]}
    <- {"jsonrpc":"2.0","result":0,"id":1}
    <- {"jsonrpc":"2.0","method":"accountNotification","params":{"subscription":0,
        "result":{"context":{"slot":7},"value":{"lamports":..,"owner":..,
        "data":["<b64>","base64"],"executable":false,"rentEpoch":..,"space":..}}}}
    -> {"jsonrpc":"2.0","id":2,"method":"accountUnsubscribe","params":[0]}
    <- {"jsonrpc":"2.0","result":true,"id":2}

A notification is sent when an account's bytes (data, lamports, owner) differ after a
transaction or an airdrop: the validator calls `AccountSubscriptions.publish` under its
lock. All transactions are final at once here, so every commitment level behaves alike.
Malformed messages get JSON-RPC errors (-32700 parse, -32600 request, -32601 method,
-32602 params) and the connection stays open.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from solders.pubkey import Pubkey
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

from psyche_solana.validator import LocalValidator, RpcFailure

log = logging.getLogger(__name__)
MAX_SUBSCRIPTIONS_PER_CONNECTION = 256
MAX_MESSAGE_BYTES = 64 * 1024        # a request; notifications out are not limited
OUTBOX_LIMIT = 1024                  # notifications queued for a client that reads too slowly
ENCODINGS = ("base64", "base58")
# Solana's answer to a deleted (or never created) account: zero lamports, system owner.
_EMPTY_ACCOUNT = {"lamports": 0, "owner": "11111111111111111111111111111111", "data": ["", "base64"],
                  "executable": False, "rentEpoch": 0, "space": 0}


@dataclass
class _Client:
    """One WebSocket connection: its subscriptions and the queue its sender thread drains
    (so that a slow reader never holds the validator's lock)."""

    connection: ServerConnection
    outbox: queue.Queue[str | None] = field(default_factory=lambda: queue.Queue(OUTBOX_LIMIT))
    subscriptions: set[int] = field(default_factory=set)
    overflowed: bool = False

    def post(self, message: dict[str, Any]) -> None:
        try:
            self.outbox.put_nowait(json.dumps(message))
        except queue.Full:  # it stopped reading: its sender thread closes it (not here,
            self.overflowed = True  # where the validator's lock may be held)


@dataclass
class _Subscription:
    client: _Client
    address: Pubkey
    encoding: str


class AccountSubscriptions:
    """Who watches which account, and the bytes each account had at the last look."""

    def __init__(self, validator: LocalValidator):
        self.validator = validator
        self.lock = threading.Lock()
        self.by_id: dict[int, _Subscription] = {}
        self.last_seen: dict[Pubkey, Any] = {}
        self.next_id = 0
        validator.on_write.append(self.publish)

    def _snapshot(self, address: Pubkey) -> Any:
        account = self.validator.engine.svm.get_account(address)
        if account is None:
            return None
        return (account.lamports, account.owner, account.executable, bytes(account.data))

    def subscribe(self, client: _Client, request_id: Any, params: Any) -> None:
        """Registers the subscription and posts the answer (its id) before any
        notification for it can be posted."""
        if not isinstance(params, list) or not 1 <= len(params) <= 2:
            raise RpcFailure(-32602, "Invalid params: expected [pubkey, config?]")
        try:
            address = Pubkey.from_string(params[0])
        except (ValueError, TypeError):
            raise RpcFailure(-32602, f"Invalid params: not a base-58 public key: {params[0]!r}") from None
        config = params[1] if len(params) == 2 and params[1] is not None else {}
        if not isinstance(config, dict):
            raise RpcFailure(-32602, "Invalid params: the config must be an object")
        encoding = config.get("encoding", "base64")
        if encoding not in ENCODINGS:
            raise RpcFailure(-32602, f"Invalid params: unsupported encoding {encoding!r} "
                             f"(base64 or base58)")
        if len(client.subscriptions) >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
            raise RpcFailure(-32602, f"Invalid params: at most {MAX_SUBSCRIPTIONS_PER_CONNECTION} "
                             "subscriptions per connection")
        with self.validator.lock, self.lock:
            subscription_id = self.next_id
            self.next_id += 1
            self.by_id[subscription_id] = _Subscription(client, address, encoding)
            client.subscriptions.add(subscription_id)
            self.last_seen.setdefault(address, self._snapshot(address))
            client.post({"jsonrpc": "2.0", "result": subscription_id, "id": request_id})

    def unsubscribe(self, client: _Client, params: Any) -> bool:
        if not isinstance(params, list) or len(params) != 1 or not isinstance(params[0], int):
            raise RpcFailure(-32602, "Invalid params: expected [subscription id]")
        with self.lock:
            if params[0] not in client.subscriptions:
                raise RpcFailure(-32602, "Invalid subscription id.")
            self._drop(client, params[0])
        return True

    def _drop(self, client: _Client, subscription_id: int) -> None:
        client.subscriptions.discard(subscription_id)
        gone = self.by_id.pop(subscription_id)
        if all(s.address != gone.address for s in self.by_id.values()):
            self.last_seen.pop(gone.address, None)

    def forget(self, client: _Client) -> None:
        with self.lock:
            for subscription_id in list(client.subscriptions):
                self._drop(client, subscription_id)

    def publish(self) -> None:
        """After a write (the validator holds its lock): notify about every changed account."""
        with self.lock:
            changed = []
            for address, before in list(self.last_seen.items()):
                now = self._snapshot(address)
                if now != before:
                    self.last_seen[address] = now
                    changed.append(address)
            slot = self.validator.engine.slot
            for subscription_id, sub in self.by_id.items():
                if sub.address in changed:
                    value = self.validator.account_json(sub.address, {"encoding": sub.encoding})
                    sub.client.post({"jsonrpc": "2.0", "method": "accountNotification", "params": {
                        "result": {"context": {"slot": slot}, "value": value or _EMPTY_ACCOUNT},
                        "subscription": subscription_id}})


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "error": {"code": code, "message": message}, "id": request_id}


class PubSubServer:
    """The WebSocket server in a background thread; raises OSError when it cannot listen."""

    def __init__(self, validator: LocalValidator, host: str = "127.0.0.1", port: int = 0):
        self.subscriptions = AccountSubscriptions(validator)
        self.server: Server = serve(self._serve_client, host, port, max_size=MAX_MESSAGE_BYTES,
                                    compression=None, logger=log)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                       name="pubsub")

    @property
    def url(self) -> str:
        host, port = self.server.socket.getsockname()[:2]
        return f"ws://{host}:{port}"

    def start(self) -> PubSubServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)

    def _serve_client(self, connection: ServerConnection) -> None:
        client = _Client(connection)
        sender = threading.Thread(target=self._send_loop, args=(client,), daemon=True)
        sender.start()
        try:
            for message in connection:
                answer = self._answer(client, message)
                if answer is not None:
                    client.post(answer)
        except ConnectionClosed:
            pass
        finally:
            self.subscriptions.forget(client)
            with contextlib.suppress(queue.Full):  # a sender that already quit drains nothing
                client.outbox.put(None, timeout=1)
            sender.join(timeout=5)

    @staticmethod
    def _send_loop(client: _Client) -> None:
        while (text := client.outbox.get()) is not None:
            try:
                client.connection.send(text)
            except ConnectionClosed:
                return
            if client.overflowed:
                log.warning("pubsub: a client stopped reading its notifications; closing it")
                client.connection.close(1008, "too slow")
                return

    def _answer(self, client: _Client, message: str | bytes) -> dict[str, Any] | None:
        """The answer to one message, or None where it was already posted."""
        try:
            request = json.loads(message)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            return _error(None, -32700, "Parse error")
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return _error(None, -32600, "Invalid request")
        request_id, method = request.get("id"), request["method"]
        params = request.get("params", [])
        try:
            if method == "accountSubscribe":
                self.subscriptions.subscribe(client, request_id, params)
                return None
            if method == "accountUnsubscribe":
                result = self.subscriptions.unsubscribe(client, params)
                return {"jsonrpc": "2.0", "result": result, "id": request_id}
        except RpcFailure as exc:
            return _error(request_id, exc.code, exc.message)
        return _error(request_id, -32601, f"Method not found: {method}")
