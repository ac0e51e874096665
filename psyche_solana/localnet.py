"""`psyche-localnet`: our programs in LiteSVM behind a Solana JSON-RPC server on loopback,
with the PubSub WebSocket next to it.

    psyche-localnet [--port 8899] [--ws-port 8900] [--host 127.0.0.1]

At start our programs (psyche_solana.ids.PROGRAMS: the coordinator, authorizer, treasurer,
distributor, ...) are built if needed and
deployed through the real upgradeable loader. The clock follows wall time (a slot every
400 ms, a fresh blockhash every slot). Methods: getHealth, getVersion, getSlot,
getBlockHeight, getEpochInfo, getLatestBlockhash, getBalance, getAccountInfo,
getMultipleAccounts, getProgramAccounts (dataSize / memcmp filters), getMinimumBalanceForRentExemption,
requestAirdrop, sendTransaction, simulateTransaction, getSignatureStatuses,
getFeeForMessage; encodings base64 (and base58 for sendTransaction), `dataSlice`
(psyche_solana.validator).

Errors use Solana's JSON-RPC format: -32602 invalid params, -32601 unknown method,
-32002 a failed transaction ("Transaction simulation failed: Error processing
Instruction 0: custom program error: 0x6c", data.err = {"InstructionError":[0,{"Custom":108}]},
data.logs), -32600 a transaction over 1232 bytes. A transaction is executed when sent
(finalized at once).

Account changes are pushed over the WebSocket (JSON-RPC port + 1 by default, as Solana's
validator does): `accountSubscribe` / `accountUnsubscribe` and `accountNotification`
(psyche_solana.pubsub); psyche_solana.subscription is the client side.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Any

import typer

from psyche_common.cli_conventions import PROGRAM_SETTINGS, version_option
from psyche_solana.pubsub import PubSubServer
from psyche_solana.validator import LocalValidator, RpcFailure

__all__ = ["CannotListen", "LocalValidator", "Localnet", "RpcFailure", "app", "main"]
log = logging.getLogger(__name__)


def _error_body(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "error": error, "id": request_id}


class _Handler(BaseHTTPRequestHandler):
    validator: LocalValidator
    max_body = 1 << 20

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib name)
        log.debug(format, *args)

    def do_GET(self) -> None:
        body = b"ok" if self.path == "/health" else b"POST JSON-RPC requests to /"
        self.send_response(200 if self.path == "/health" else 405)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > self.max_body:
            response: Any = _error_body(None, -32600, "request too large")
        else:
            try:
                request = json.loads(self.rfile.read(length))
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                response = _error_body(None, -32700, "Parse error")
            else:
                if isinstance(request, list):
                    response = [self._one(r) for r in request[:100]]
                else:
                    response = self._one(request)
        body = json.dumps(response).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _one(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return _error_body(None, -32600, "Invalid request")
        request_id = request.get("id")
        try:
            result = self.validator.handle(request["method"], request.get("params", []))
        except RpcFailure as exc:
            return _error_body(request_id, exc.code, exc.message, exc.data)
        except TypeError as exc:
            return _error_body(request_id, -32602, f"Invalid params: {exc}")
        except Exception as exc:  # a bug must not stop the validator: report it
            log.exception("internal error in %s", request.get("method"))
            return _error_body(request_id, -32603, f"Internal error: {exc}")
        return {"jsonrpc": "2.0", "result": result, "id": request_id}


class CannotListen(Exception):
    """A server of the localnet could not bind its address (the message says which)."""


def _listen_error(what: str, host: str, port: int, exc: OSError) -> CannotListen:
    # os.strerror: the errno's words alone (a socket error's own text may name the address)
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return CannotListen(f"cannot listen for {what} on {host}:{port}: {reason}")


class Localnet:
    """The JSON-RPC (HTTP) and PubSub (WebSocket) servers in background threads:
    `with Localnet() as net: net.url, net.ws_url`.

    `ws_port` None: the JSON-RPC port + 1, as a Solana validator does (any free port when
    the JSON-RPC port is 0). Raises CannotListen when either port cannot be bound.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 validator: LocalValidator | None = None, ws_port: int | None = None):
        self.validator = validator or LocalValidator()
        handler = type("Handler", (_Handler,), {"validator": self.validator})
        try:
            self.server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise _listen_error("JSON-RPC", host, port, exc) from None
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        if ws_port is None:
            ws_port = self.server.server_address[1] + 1 if port else 0
        try:
            self.pubsub = PubSubServer(self.validator, host, ws_port)
        except OSError as exc:
            self.server.server_close()
            raise _listen_error("WebSocket (PubSub)", host, ws_port, exc) from None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        host_text = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{host_text}:{port}"

    @property
    def ws_url(self) -> str:
        return self.pubsub.url

    def start(self) -> Localnet:
        self.thread.start()
        self.pubsub.start()
        return self

    def stop(self) -> None:
        self.pubsub.stop()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> Localnet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


app = typer.Typer(**PROGRAM_SETTINGS, add_completion=False)


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                      help="JSON-RPC port (0: any free port)")] = 8899,
    ws_port: Annotated[int | None, typer.Option(
        "--ws-port", min=0, max=65535,
        help="WebSocket (PubSub) port [default: --port + 1; 0: any free port]")] = None,
    version: Annotated[bool, version_option("psyche-localnet")] = False,
) -> None:
    """Our programs in LiteSVM behind a Solana JSON-RPC server (HTTP) and its PubSub
    WebSocket (accountSubscribe).

    Serves until ctrl+c.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        net = Localnet(host, port, ws_port=ws_port)
    except CannotListen as exc:  # the port is taken, or the address is not this host's
        typer.echo(f"psyche-localnet: {exc}", err=True)
        raise typer.Exit(code=1) from None
    from psyche_solana.ids import PROGRAMS, program_id

    print(f"psyche-localnet: JSON-RPC on {net.url}", flush=True)
    print(f"psyche-localnet: WebSocket on {net.ws_url}", flush=True)
    for name in PROGRAMS:
        print(f"  {name:<12} {program_id(name)}", flush=True)
    net.pubsub.start()
    try:
        net.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        net.pubsub.stop()
        net.server.server_close()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (psyche-localnet)."""
    app(args=argv, prog_name="psyche-localnet")


if __name__ == "__main__":
    main()
