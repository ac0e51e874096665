"""Wallets the run-manager needs without any on-chain program: new, show, balance.

A wallet is a solana-keygen keypair file: a JSON array of 64 bytes (32-byte ed25519
secret seed followed by the 32-byte public key), readable by its owner only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

LAMPORTS_PER_SOL = 1_000_000_000


class WalletError(Exception):
    """A wallet file or a balance query failed; the message says why."""


def create_keypair_file(path: Path) -> str:
    """Writes a fresh keypair to `path` (mode 600); refuses to overwrite. Returns the pubkey."""
    from solders.keypair import Keypair

    keypair = Keypair()
    secret = list(bytes(keypair))  # 64 bytes: seed || pubkey, as solana-keygen writes them
    try:
        # O_EXCL: never overwrite a wallet, even one created between a check and the write.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise WalletError(f"{path} exists; refusing to overwrite a wallet") from None
    except OSError as error:
        raise WalletError(f"cannot create {path}: {error.strerror}") from None
    with os.fdopen(descriptor, "w") as handle:
        json.dump(secret, handle)
    path.chmod(0o600)  # the umask may have narrowed it; make it exactly 600
    return str(keypair.pubkey())


def load_keypair_bytes(path: Path) -> bytes:
    """Reads and checks a solana-keygen keypair file; returns its 64 bytes."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise WalletError(f"cannot read {path}: no such file") from None
    except OSError as error:
        raise WalletError(f"cannot read {path}: {error.strerror}") from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise WalletError(f"{path} is not JSON ({error.msg}); expected a 64-byte array") from None
    except RecursionError:
        raise WalletError(f"{path} is JSON nested too deeply; expected a 64-byte array") from None
    if (
        not isinstance(values, list)
        or len(values) != 64
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in values)
    ):
        raise WalletError(f"{path} is not a solana-keygen keypair (a JSON array of 64 bytes)")
    raw = bytes(values)
    from solders.keypair import Keypair

    # The public half must be the one the secret seed derives (solana-keygen writes both).
    if bytes(Keypair.from_seed(raw[:32]).pubkey()) != raw[32:]:
        raise WalletError(f"{path}: public key half does not match the secret half")
    return raw


def public_key(path: Path) -> str:
    """The base58 public key of the keypair file at `path`."""
    return _base58(load_keypair_bytes(path)[32:])


def get_balance(rpc_url: str, address: str, timeout_s: float = 10.0) -> int:
    """Lamports held by `address`, asked over Solana JSON-RPC (`getBalance`)."""
    request = {"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [address]}
    try:
        response = httpx.post(rpc_url, json=request, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise WalletError(f"RPC {rpc_url} unreachable: {error}") from None
    if response.status_code != 200:
        raise WalletError(f"RPC {rpc_url} answered HTTP {response.status_code}")
    try:
        body = response.json()
    except ValueError:
        raise WalletError(f"RPC {rpc_url} answered something that is not JSON") from None
    if not isinstance(body, dict):
        raise WalletError(f"RPC {rpc_url} answered an unexpected JSON value")
    if "error" in body:
        detail = body["error"] if isinstance(body["error"], dict) else {}
        raise WalletError(f"RPC error {detail.get('code')}: {detail.get('message', body['error'])}")
    result = body.get("result")
    # Solana wraps the answer: {"context": {"slot": n}, "value": lamports}.
    value = result.get("value") if isinstance(result, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WalletError(f"RPC {rpc_url} answered getBalance without a lamport count: {body!r}")
    return value


def format_sol(lamports: int) -> str:
    return f"{lamports / LAMPORTS_PER_SOL:.9f} SOL"


def _base58(data: bytes) -> str:
    from solders.pubkey import Pubkey

    return str(Pubkey.from_bytes(data))
