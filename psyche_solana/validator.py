"""The local validator's JSON-RPC methods over one ProgramSvm (LiteSVM with our programs).

`LocalValidator.handle(method, params)` runs one Solana JSON-RPC method and returns its
`result`, or raises `RpcFailure` (code, message, data) in Solana's error format; the HTTP
server (psyche_solana.localnet) and the PubSub server (psyche_solana.pubsub) sit in front.
`on_write` callbacks run, under the lock, after every method that can change accounts:
that is how the PubSub server learns which accounts to notify about.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from solders.pubkey import Pubkey
from solders.signature import Signature
from solders.transaction import VersionedTransaction
from solders.transaction_metadata import FailedTransactionMetadata
from solders.transaction_status import InstructionErrorCustom, TransactionErrorInstructionError

from psyche_solana.b58 import b58decode, b58encode
from psyche_solana.svm import MAX_TRANSACTION_SIZE, ProgramSvm

log = logging.getLogger(__name__)
SLOT_SECONDS = 0.4
VERSION = {"solana-core": "2.2.0-psyche-localnet", "feature-set": 0}
# The methods that can change an account; any other method only reads.
WRITING_METHODS = frozenset({"sendTransaction", "requestAirdrop"})


class RpcFailure(Exception):
    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def _invalid(message: str) -> RpcFailure:
    return RpcFailure(-32602, f"Invalid params: {message}")


def _pubkey(value: Any, what: str = "pubkey") -> Pubkey:
    try:
        return Pubkey.from_string(value)
    except (ValueError, TypeError):
        raise _invalid(f"{what} is not a base-58 public key: {value!r}") from None


def _transaction_error_json(err: object) -> Any:
    """A TransactionError as Solana's JSON: {"InstructionError": [0, {"Custom": 108}]}."""
    if isinstance(err, TransactionErrorInstructionError):
        inner = err.err
        detail: Any = {"Custom": inner.code} if isinstance(inner, InstructionErrorCustom) else \
            str(inner).rsplit(".", 1)[-1]
        return {"InstructionError": [err.index, detail]}
    return str(err).rsplit(".", 1)[-1]


class LocalValidator:
    """The JSON-RPC methods over one ProgramSvm; thread-safe (one lock)."""

    def __init__(self, svm: ProgramSvm | None = None):
        self.engine = svm or ProgramSvm(use_loader=True)
        self.engine.svm = self.engine.svm.with_blockhash_check(False)
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.base_slot = self.engine.slot
        self.statuses: dict[str, dict[str, Any]] = {}
        # Called under the lock after each writing method, even a failed one (its fee
        # payer may still have been charged): the PubSub server compares its accounts.
        self.on_write: list[Callable[[], None]] = []
        self._sync_clock()

    # -- time
    def _sync_clock(self) -> None:
        slot = self.base_slot + int((time.monotonic() - self.started) / SLOT_SECONDS)
        if slot > self.engine.slot:
            self.engine.slot = slot
            self.engine.svm.warp_to_slot(slot)
            self.engine.svm.expire_blockhash()
        self.engine.set_time(int(time.time()))

    def handle(self, method: str, params: list[Any]) -> Any:
        handler = getattr(self, f"rpc_{method}", None)
        if handler is None:
            raise RpcFailure(-32601, f"Method not found: {method}")
        if not isinstance(params, list):
            raise _invalid("params must be an array")
        with self.lock:
            self._sync_clock()
            try:
                return handler(*params)
            finally:
                if method in WRITING_METHODS:
                    self.written()

    def written(self) -> None:
        """Tell the `on_write` callbacks that accounts may have changed; the caller holds
        the lock (a test that edits accounts in the SVM directly calls this too)."""
        for callback in self.on_write:
            callback()

    def _context(self, value: Any) -> dict[str, Any]:
        return {"context": {"slot": self.engine.slot, "apiVersion": "2.2.0"}, "value": value}

    # -- methods
    def rpc_getHealth(self) -> str:
        return "ok"

    def rpc_getVersion(self) -> dict[str, Any]:
        return VERSION

    def rpc_getSlot(self, config: Any = None) -> int:
        return self.engine.slot

    def rpc_getBlockHeight(self, config: Any = None) -> int:
        return self.engine.slot

    def rpc_getEpochInfo(self, config: Any = None) -> dict[str, Any]:
        return {"absoluteSlot": self.engine.slot, "blockHeight": self.engine.slot, "epoch": 0,
                "slotIndex": self.engine.slot, "slotsInEpoch": 432000, "transactionCount": None}

    def rpc_getLatestBlockhash(self, config: Any = None) -> dict[str, Any]:
        return self._context({"blockhash": str(self.engine.svm.latest_blockhash()),
                              "lastValidBlockHeight": self.engine.slot + 150})

    def rpc_getBalance(self, address: str, config: Any = None) -> dict[str, Any]:
        return self._context(self.engine.svm.get_balance(_pubkey(address)) or 0)

    def account_json(self, address: Pubkey, config: dict[str, Any]) -> Any:
        account = self.engine.svm.get_account(address)
        if account is None or (account.lamports == 0 and not account.data):
            return None
        data = bytes(account.data)
        data_slice = config.get("dataSlice")
        if data_slice is not None:
            try:
                offset, length = int(data_slice["offset"]), int(data_slice["length"])
            except (KeyError, TypeError, ValueError):
                raise _invalid("dataSlice needs integer offset and length") from None
            data = data[offset:offset + length]
        encoding = config.get("encoding", "base64")
        if encoding not in ("base64", "base58"):
            raise _invalid(f"unsupported encoding {encoding!r} (base64 or base58)")
        encoded = base64.b64encode(data).decode() if encoding == "base64" else b58encode(data)
        return {"data": [encoded, encoding], "executable": account.executable,
                "lamports": account.lamports, "owner": str(account.owner),
                "rentEpoch": account.rent_epoch, "space": len(account.data)}

    def rpc_getAccountInfo(self, address: str, config: dict[str, Any] | None = None) -> Any:
        return self._context(self.account_json(_pubkey(address), config or {}))

    def rpc_getMultipleAccounts(self, addresses: list[str], config: dict[str, Any] | None = None) -> Any:
        if not isinstance(addresses, list) or len(addresses) > 100:
            raise _invalid("expected an array of at most 100 addresses")
        return self._context([self.account_json(_pubkey(a), config or {}) for a in addresses])

    def rpc_getProgramAccounts(self, program: str, config: dict[str, Any] | None = None) -> Any:
        config = config or {}
        matches = []
        for address, account in self.engine.svm.get_program_accounts(_pubkey(program, "program id")):
            data = bytes(account.data)
            if all(self._filter_matches(f, data) for f in config.get("filters", [])):
                matches.append({"pubkey": str(address), "account": self.account_json(address, config)})
        return self._context(matches) if config.get("withContext") else matches

    @staticmethod
    def _filter_matches(rule: Any, data: bytes) -> bool:
        if isinstance(rule, dict) and "dataSize" in rule:
            return len(data) == rule["dataSize"]
        if isinstance(rule, dict) and isinstance(rule.get("memcmp"), dict):
            memcmp = rule["memcmp"]
            try:
                offset = int(memcmp["offset"])
                raw = (base64.b64decode(memcmp["bytes"]) if memcmp.get("encoding") == "base64"
                       else b58decode(memcmp["bytes"]))
            except (KeyError, TypeError, ValueError):
                raise _invalid("memcmp needs offset and bytes") from None
            return data[offset:offset + len(raw)] == raw
        raise _invalid(f"unsupported filter {rule!r} (dataSize or memcmp)")

    def rpc_getMinimumBalanceForRentExemption(self, size: int, config: Any = None) -> int:
        if not isinstance(size, int) or size < 0:
            raise _invalid("size must be a non-negative integer")
        return int(self.engine.svm.minimum_balance_for_rent_exemption(size))

    def rpc_requestAirdrop(self, address: str, lamports: int, config: Any = None) -> str:
        if not isinstance(lamports, int) or not 0 < lamports <= 1_000 * 10**9:
            raise _invalid("lamports must be between 1 and 1000 SOL")
        result = self.engine.svm.airdrop(_pubkey(address), lamports)
        if isinstance(result, FailedTransactionMetadata):
            raise RpcFailure(-32002, f"airdrop failed: {result.err()}")
        signature = str(result.signature())
        self.statuses[signature] = {"slot": self.engine.slot, "confirmations": None, "err": None,
                                    "status": {"Ok": None}, "confirmationStatus": "finalized"}
        return signature

    def _decode_transaction(self, encoded: Any, config: dict[str, Any]) -> bytes:
        encoding = config.get("encoding", "base58")
        try:
            raw = base64.b64decode(encoded, validate=True) if encoding == "base64" else \
                b58decode(encoded)
        except (ValueError, TypeError):
            raise _invalid(f"transaction is not valid {encoding}") from None
        if len(raw) > MAX_TRANSACTION_SIZE:
            raise RpcFailure(-32602, f"base64 encoded solana_transaction::Transaction too large: "
                             f"{len(raw)} bytes (max: encoded/raw {1644}/{MAX_TRANSACTION_SIZE})")
        return raw

    def _parse(self, raw: bytes) -> VersionedTransaction:
        try:
            return VersionedTransaction.from_bytes(raw)
        except ValueError:
            raise _invalid("failed to deserialize the transaction") from None

    def rpc_sendTransaction(self, encoded: str, config: dict[str, Any] | None = None) -> str:
        tx = self._parse(self._decode_transaction(encoded, config or {}))
        signature = str(tx.signatures[0])
        result = self.engine.svm.send_transaction(tx)
        if isinstance(result, FailedTransactionMetadata):
            meta = result.meta()
            err = _transaction_error_json(result.err())
            logs = list(meta.logs())
            reason = str(result.err())
            if isinstance(err, dict):
                index, detail = err["InstructionError"]
                what = (f"custom program error: {detail['Custom']:#x}" if isinstance(detail, dict)
                        else detail)
                reason = f"Error processing Instruction {index}: {what}"
            raise RpcFailure(-32002, f"Transaction simulation failed: {reason}", {
                "err": err, "logs": logs, "accounts": None,
                "unitsConsumed": meta.compute_units_consumed(), "returnData": None})
        self.statuses[signature] = {"slot": self.engine.slot, "confirmations": None, "err": None,
                                    "status": {"Ok": None}, "confirmationStatus": "finalized",
                                    "unitsConsumed": result.compute_units_consumed(),
                                    "logs": list(result.logs())}
        return signature

    def rpc_simulateTransaction(self, encoded: str, config: dict[str, Any] | None = None) -> Any:
        config = config or {}
        tx = self._parse(self._decode_transaction(encoded, {"encoding": config.get("encoding", "base58")}))
        result = self.engine.svm.simulate_transaction(tx)
        if isinstance(result, FailedTransactionMetadata):
            meta = result.meta()
            return self._context({"err": _transaction_error_json(result.err()),
                                  "logs": list(meta.logs()),
                                  "unitsConsumed": meta.compute_units_consumed()})
        meta = result.meta()
        return self._context({"err": None, "logs": list(meta.logs()),
                              "unitsConsumed": meta.compute_units_consumed()})

    def rpc_getSignatureStatuses(self, signatures: list[str], config: Any = None) -> Any:
        if not isinstance(signatures, list) or len(signatures) > 256:
            raise _invalid("expected an array of at most 256 signatures")
        out = []
        for text in signatures:
            try:
                Signature.from_string(text)
            except ValueError:
                raise _invalid(f"not a signature: {text!r}") from None
            status = self.statuses.get(text)
            out.append(None if status is None else {
                k: v for k, v in status.items() if k not in ("logs", "unitsConsumed")})
        return self._context(out)

    def rpc_getFeeForMessage(self, message: str, config: Any = None) -> Any:
        return self._context(5000)

    def rpc_getTransaction(self, signature: str, config: Any = None) -> Any:
        status = self.statuses.get(signature)
        if status is None:
            return None
        return {"slot": status["slot"], "meta": {"err": None, "logMessages": status.get("logs", []),
                                                 "computeUnitsConsumed": status.get("unitsConsumed")}}
