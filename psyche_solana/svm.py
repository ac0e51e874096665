"""Our programs in an in-process LiteSVM: the engine of the localnet, the tests and the
benchmark. `ProgramSvm.send(instructions, signers)` returns the transaction's metadata or
raises `TransactionFailed` carrying the custom error code, its name and the logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solders.compute_budget import set_compute_unit_limit
from solders.instruction import Instruction
from solders.keypair import Keypair
from solders.litesvm import LiteSVM
from solders.message import Message
from solders.pubkey import Pubkey
from solders.transaction import Transaction
from solders.transaction_metadata import FailedTransactionMetadata
from solders.transaction_status import InstructionErrorCustom, TransactionErrorInstructionError

from psyche_solana.build import build
from psyche_solana.deploy import deploy
from psyche_solana.errors import describe
from psyche_solana.ids import PROGRAMS, program_id, program_keypair

MAX_TRANSACTION_SIZE = 1232


class TransactionFailed(RuntimeError):
    def __init__(self, message: str, code: int | None = None, logs: Sequence[str] = ()):
        super().__init__(message)
        self.code = code
        self.logs = list(logs)


@dataclass(frozen=True)
class Sent:
    signature: str
    compute_units: int
    logs: list[str]


def custom_error_code(err: object) -> int | None:
    """The custom program error code in a transaction error, if any."""
    if isinstance(err, TransactionErrorInstructionError):
        inner = err.err
        if isinstance(inner, InstructionErrorCustom):
            return int(inner.code)
    text = str(err)
    marker = "Custom("
    if marker in text:
        return int(text.split(marker, 1)[1].split(")", 1)[0])
    return None


def failure_message(err: object, logs: Sequence[str]) -> tuple[str, int | None]:
    code = custom_error_code(err)
    if code is not None:
        return f"program error {code}: {describe(code)}", code
    return f"transaction failed: {err}", None


class ProgramSvm:
    def __init__(self, compute_unit_limit: int = 1_400_000, use_loader: bool = False) -> None:
        """`use_loader`: deploy through the upgradeable loader (as on a real cluster)
        instead of LiteSVM's direct program injection (faster, for tests)."""
        self.svm = LiteSVM()
        self.compute_unit_limit = compute_unit_limit
        self.payer = Keypair()
        self.svm.airdrop(self.payer.pubkey(), 10_000 * 10**9)
        self.now = 1_700_000_000
        self.slot = 1
        for name, path in build().items():
            if use_loader:
                deploy(self.send, self.payer.pubkey(),
                       program_keypair(name), path.read_bytes(), self.payer,
                       self.svm.minimum_balance_for_rent_exemption)
            else:
                self.svm.add_program(program_id(name), path.read_bytes())
        self.slot += 1  # a deployed program is visible from the next slot
        self.svm.warp_to_slot(self.slot)
        self.set_time(self.now)

    def set_time(self, unix_timestamp: int) -> None:
        clock = self.svm.get_clock()
        clock.unix_timestamp = unix_timestamp
        clock.slot = self.slot
        self.svm.set_clock(clock)
        self.now = unix_timestamp

    def advance(self, seconds: int, slots: int = 1) -> None:
        self.slot += slots
        self.svm.warp_to_slot(self.slot)
        self.set_time(self.now + seconds)

    def airdrop(self, to: Pubkey, lamports: int) -> None:
        self.svm.airdrop(to, lamports)

    def transaction(self, instructions: Sequence[Instruction], signers: Sequence[Keypair],
                    payer: Keypair | None = None) -> Transaction:
        payer = payer or self.payer
        budget = [set_compute_unit_limit(self.compute_unit_limit)]
        keys = {payer.pubkey(): payer, **{s.pubkey(): s for s in signers}}
        message = Message([*budget, *instructions], payer.pubkey())
        return Transaction(list(keys.values()), message, self.svm.latest_blockhash())

    def send_transaction(self, tx: Transaction) -> Sent:
        size = len(bytes(tx))
        if size > MAX_TRANSACTION_SIZE:
            raise TransactionFailed(
                f"transaction too large: {size} bytes > {MAX_TRANSACTION_SIZE}")
        result = self.svm.send_transaction(tx)
        self.svm.expire_blockhash()
        if isinstance(result, FailedTransactionMetadata):
            meta = result.meta()
            message, code = failure_message(result.err(), meta.logs())
            raise TransactionFailed(message, code, meta.logs())
        return Sent(str(result.signature()), result.compute_units_consumed(), list(result.logs()))

    def send(self, instructions: Sequence[Instruction], signers: Sequence[Keypair] = (),
             payer: Keypair | None = None) -> Sent:
        return self.send_transaction(self.transaction(instructions, signers, payer))

    def data(self, address: Pubkey) -> bytes:
        account = self.svm.get_account(address)
        if account is None:
            raise KeyError(f"no account {address}")
        return bytes(account.data)

    def programs(self) -> dict[str, Pubkey]:
        return {name: program_id(name) for name in PROGRAMS}
