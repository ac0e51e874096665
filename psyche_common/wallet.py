"""Wallets the run-manager needs without any on-chain program: new, show, balance.

A wallet is a solana-keygen keypair file: a JSON array of 64 bytes (32-byte ed25519
secret seed followed by the 32-byte public key), readable by its owner only. Like
Psyche's run-manager, the base58 string of the same 64 bytes is accepted too, in a file
or in RAW_WALLET_PRIVATE_KEY (`parse_keypair_text`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

LAMPORTS_PER_SOL = 1_000_000_000
# Bitcoin's base58 alphabet, as Solana writes keys (psyche_common sits below psyche_solana,
# whose b58 module it may not import).
_BASE58_INDEX = {char: index for index, char in
                 enumerate("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")}


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
    """Reads and checks a keypair file; returns its 64 bytes (see `parse_keypair_text`)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise WalletError(f"cannot read {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not text"
        raise WalletError(f"cannot read {path}: {reason}") from None
    return parse_keypair_text(text, str(path))


def parse_keypair_text(text: str, source: str) -> bytes:
    """The 64 keypair bytes of `text`, in either form Psyche's run-manager takes.

    A solana-keygen JSON array of 64 bytes, or the base58 string of those 64 bytes (how
    wallets export a key, and the form Psyche's docs give RAW_WALLET_PRIVATE_KEY in).
    `source` names the text in errors: a file path or a variable name.
    """
    stripped = text.strip()
    if stripped.startswith("["):
        raw = _json_keypair(stripped, source)
    elif stripped and all(char in _BASE58_INDEX for char in stripped):
        raw = _base58_keypair(stripped, source)
    else:
        raise WalletError(f"{source} is neither a JSON array of 64 bytes (solana-keygen) nor a "
                          "base58 keypair")
    from solders.keypair import Keypair

    # The public half must be the one the secret seed derives (solana-keygen writes both).
    if bytes(Keypair.from_seed(raw[:32]).pubkey()) != raw[32:]:
        raise WalletError(f"{source}: public key half does not match the secret half")
    return raw


def _json_keypair(text: str, source: str) -> bytes:
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise WalletError(f"{source} is not JSON ({error.msg}); expected a 64-byte array") from None
    except RecursionError:
        raise WalletError(f"{source} is JSON nested too deeply; expected a 64-byte array") from None
    if (
        not isinstance(values, list)
        or len(values) != 64
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in values)
    ):
        raise WalletError(f"{source} is not a solana-keygen keypair (a JSON array of 64 bytes)")
    return bytes(values)


def _base58_keypair(text: str, source: str) -> bytes:
    # 64 bytes are at most 88 base58 digits; longer text cannot be a keypair (and would
    # make the big-integer conversion below needlessly slow).
    if len(text) > 88:
        raise WalletError(f"{source} is {len(text)} base58 digits; a keypair is at most 88")
    number = 0
    for char in text:
        number = number * 58 + _BASE58_INDEX[char]
    zeros = len(text) - len(text.lstrip("1"))  # each leading "1" is a leading zero byte
    raw = b"\0" * zeros + (number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b"")
    if len(raw) != 64:
        raise WalletError(f"{source} decodes to {len(raw)} bytes; a base58 keypair is 64")
    return raw


def public_key(path: Path) -> str:
    """The base58 public key of the keypair file at `path`."""
    return _base58(load_keypair_bytes(path)[32:])


def keypair_public_key(raw: bytes) -> str:
    """The base58 public key of 64 checked keypair bytes."""
    return _base58(raw[32:])


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
