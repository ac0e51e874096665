"""An async Solana JSON-RPC client on httpx: a primary and fallback endpoints (RPC, RPC_2),
retries with exponential backoff for transport failures, and clear errors for on-chain
failures (custom error codes in the words of the program that failed:
psyche_solana.program_failures).

    rpc = SolanaRpc(["http://127.0.0.1:8899", os.environ.get("RPC_2")])
    signature = await rpc.send_instructions(ix.tick_with_budget(run), payer, [])
    data = await rpc.account_data(address)           # None if the account does not exist
    # account changes: psyche_solana.subscription.AccountSubscription (accountSubscribe)

Transport errors (connection refused, timeouts, HTTP 5xx/429) are retried on every
endpoint in turn; JSON-RPC errors are raised as `RpcError` at once, except
"blockhash not found", which is retried with a fresh blockhash. A failed transaction
raises `ProgramError` (a subclass) with `.code` (the custom code), `.name`, `.logs`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from solders.hash import Hash
from solders.instruction import Instruction
from solders.keypair import Keypair
from solders.message import Message
from solders.pubkey import Pubkey
from solders.transaction import Transaction

from psyche_solana.b58 import b58encode
from psyche_solana.program_failures import describe_failure, failed_program

log = logging.getLogger(__name__)
MAX_TRANSACTION_SIZE = 1232
NONCE_SLICE = {"offset": 16, "length": 8}  # coordinator account: magic u64 | version u64 | nonce u64


class RpcError(RuntimeError):
    def __init__(self, message: str, code: int | None = None, data: Any = None):
        super().__init__(message)
        self.rpc_code, self.data = code, data


class ProgramError(RpcError):
    """A transaction failed on-chain; `name` is the error's word (e.g. NotAuthorized)."""

    def __init__(self, message: str, code: int | None, name: str, logs: list[str]):
        super().__init__(message, -32002)
        self.code, self.name, self.logs = code, name, logs


class TransactionTooLarge(RpcError):
    pass


class RpcUnavailable(RpcError):
    """No endpoint answered after every retry."""


@dataclass
class _Endpoint:
    url: str
    failures: int = 0


def program_error(data: Any, instructions: Sequence[Instruction],
                  payer: Pubkey | None = None) -> ProgramError:
    """Turn Solana's error `data` ({"err": {"InstructionError": [i, {"Custom": n}]}, ...})
    into a ProgramError naming the program that failed and its error in that program's
    words (psyche_solana.program_failures): a System or Token error is not ours."""
    logs = list((data or {}).get("logs") or [])
    err = (data or {}).get("err")
    if isinstance(err, dict) and "InstructionError" in err:
        index, detail = err["InstructionError"]
        if isinstance(detail, dict) and "Custom" in detail:
            code = int(detail["Custom"])
            # index is relative to the message, whose instructions these are
            top_level = instructions[index].program_id if 0 <= index < len(instructions) else None
            failed = failed_program(logs, top_level)
            name, message = describe_failure(code, failed, top_level, logs, payer)
            return ProgramError(message, code, name, logs)
        return ProgramError(f"instruction {index} failed: {detail}", None, str(detail), logs)
    return ProgramError(f"transaction failed: {err}", None, str(err), logs)


class SolanaRpc:
    def __init__(self, urls: Sequence[str | None], *, timeout_s: float = 10.0, retries: int = 3,
                 backoff_s: float = 0.2, max_backoff_s: float = 3.0):
        endpoints = [url for url in urls if url]
        if not endpoints:
            raise ValueError("at least one RPC URL is needed (RPC, or --rpc)")
        self.endpoints = [_Endpoint(url) for url in endpoints]
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.http = httpx.AsyncClient(timeout=timeout_s)
        self._id = 0

    async def close(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> SolanaRpc:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(self, method: str, *params: Any) -> Any:
        """One JSON-RPC call with retries and fallback; returns `result`."""
        last: Exception | None = None
        delay = self.backoff_s
        for attempt in range(self.retries):
            for endpoint in sorted(self.endpoints, key=lambda e: e.failures):
                self._id += 1
                try:
                    response = await self.http.post(endpoint.url, json={
                        "jsonrpc": "2.0", "id": self._id, "method": method, "params": list(params)})
                    if response.status_code == 429 or response.status_code >= 500:
                        raise httpx.HTTPStatusError(f"HTTP {response.status_code}",
                                                    request=response.request, response=response)
                    body = response.json()
                except (httpx.HTTPError, ValueError) as exc:
                    endpoint.failures += 1
                    last = exc
                    log.debug("%s %s failed (%s), trying the next endpoint", endpoint.url, method, exc)
                    continue
                if not isinstance(body, dict):
                    last = RpcError(f"{endpoint.url}: malformed JSON-RPC response")
                    continue
                error = body.get("error")
                if error is not None:
                    raise RpcError(f"{method}: {error.get('message', error)}", error.get("code"),
                                   error.get("data"))
                return body.get("result")
            if attempt + 1 < self.retries:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
        urls = ", ".join(e.url for e in self.endpoints)
        raise RpcUnavailable(f"{method}: no RPC endpoint answered ({urls}): {last}")

    # -- reads
    async def account_info(self, address: Pubkey, data_slice: dict[str, int] | None = None) -> Any:
        config: dict[str, Any] = {"encoding": "base64", "commitment": "confirmed"}
        if data_slice:
            config["dataSlice"] = data_slice
        return (await self.call("getAccountInfo", str(address), config))["value"]

    async def account_data(self, address: Pubkey, data_slice: dict[str, int] | None = None) -> bytes | None:
        value = await self.account_info(address, data_slice)
        if value is None:
            return None
        return base64.b64decode(value["data"][0])

    async def balance(self, address: Pubkey) -> int:
        return int((await self.call("getBalance", str(address)))["value"])

    async def minimum_balance(self, size: int) -> int:
        return int(await self.call("getMinimumBalanceForRentExemption", size))

    async def latest_blockhash(self) -> Hash:
        value = (await self.call("getLatestBlockhash", {"commitment": "confirmed"}))["value"]
        return Hash.from_string(value["blockhash"])

    async def program_accounts(self, program: Pubkey, data_size: int | None = None,
                               memcmp: Sequence[tuple[int, bytes]] = ()) -> list[tuple[Pubkey, bytes]]:
        filters: list[dict[str, Any]] = [{"dataSize": data_size}] if data_size is not None else []
        filters += [{"memcmp": {"offset": offset, "bytes": b58encode(raw)}} for offset, raw in memcmp]
        result = await self.call("getProgramAccounts", str(program),
                                 {"encoding": "base64", "filters": filters})
        return [(Pubkey.from_string(item["pubkey"]), base64.b64decode(item["account"]["data"][0]))
                for item in result]

    async def airdrop(self, address: Pubkey, lamports: int) -> str:
        signature: str = await self.call("requestAirdrop", str(address), lamports)
        await self.confirm(signature)
        return signature

    # -- transactions
    async def send_instructions(self, instructions: Sequence[Instruction], payer: Keypair,
                                signers: Sequence[Keypair] = (), confirm: bool = True) -> str:
        """Sign, check the 1232-byte limit, send, and (by default) wait for confirmation."""
        keys = {payer.pubkey(): payer, **{s.pubkey(): s for s in signers}}
        for attempt in range(3):
            blockhash = await self.latest_blockhash()
            tx = Transaction(list(keys.values()), Message(list(instructions), payer.pubkey()),
                             blockhash)
            raw = bytes(tx)
            if len(raw) > MAX_TRANSACTION_SIZE:
                raise TransactionTooLarge(f"transaction too large: {len(raw)} bytes > "
                                          f"{MAX_TRANSACTION_SIZE} (split the instructions)")
            try:
                signature: str = await self.call(
                    "sendTransaction", base64.b64encode(raw).decode(),
                    {"encoding": "base64", "preflightCommitment": "confirmed"})
            except RpcError as exc:
                if exc.rpc_code == -32002:
                    if "Blockhash not found" in str(exc) and attempt < 2:
                        continue
                    raise program_error(exc.data, instructions, payer.pubkey()) from None
                raise
            if confirm:
                await self.confirm(signature)
            return signature
        raise RpcError("the blockhash kept expiring")

    async def confirm(self, signature: str, timeout_s: float = 60.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            statuses = (await self.call("getSignatureStatuses", [signature]))["value"]
            status = statuses[0] if statuses else None
            if status is not None:
                if status.get("err") is not None:
                    raise program_error({"err": status["err"]}, [])
                if status.get("confirmationStatus") in ("confirmed", "finalized"):
                    return
            if asyncio.get_running_loop().time() > deadline:
                raise RpcError(f"transaction {signature} not confirmed in {timeout_s:.0f} s")
            await asyncio.sleep(0.4)


async def multiple_account_data(rpc: SolanaRpc, addresses: Sequence[Pubkey]) -> list[bytes | None]:
    """getMultipleAccounts in batches of 100."""
    out: list[bytes | None] = []
    for start in range(0, len(addresses), 100):
        batch = [str(a) for a in addresses[start:start + 100]]
        values = (await rpc.call("getMultipleAccounts", batch, {"encoding": "base64"}))["value"]
        out += [None if v is None else base64.b64decode(v["data"][0]) for v in values]
    return out
