"""A small real Solana JSON-RPC server for tests: answers from a LiteSVM instance."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from solders.litesvm import LiteSVM
from solders.pubkey import Pubkey


def _handler_for(svm: LiteSVM, lock: threading.Lock) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = self._answer(request)
            payload = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request.get("id")}
            if request.get("method") != "getBalance":
                reply["error"] = {"code": -32601, "message": "Method not found"}
                return reply
            try:
                pubkey = Pubkey.from_string(request["params"][0])
            except (ValueError, KeyError, IndexError):
                reply["error"] = {"code": -32602, "message": "Invalid param: Invalid"}
                return reply
            with lock:
                lamports = svm.get_balance(pubkey) or 0
                slot = svm.get_clock().slot
            reply["result"] = {"context": {"slot": slot}, "value": lamports}
            return reply

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return Handler


@contextmanager
def litesvm_rpc(svm: LiteSVM) -> Iterator[str]:
    """Serves `svm` on 127.0.0.1:<free port>; yields the URL; stops the server after."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(svm, threading.Lock()))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
