"""A run's metadata (Psyche's RunMetadata: name, description, parameter count, vocabulary
size) and closing a treasurer run: the instruction builders beside instructions.py.

The metadata lives in the coordinator program's PDA ["metadata", coordinator account]
(programs/run_metadata.h), not in the run's state, whose layout coordinator/ mirrors.
A treasurer run's authority is its Run PDA, so the treasurer forwards both the metadata
(treasurer instruction 3) and the close (4) for the Run's main authority.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from solders.instruction import AccountMeta, Instruction
from solders.pubkey import Pubkey

from psyche_solana.ids import SYSTEM_PROGRAM_ID, coordinator_program, treasurer_program
from psyche_solana.instructions import coordinator_instance_address, treasurer_run_address
from psyche_solana.rpc import SolanaRpc

NAME_MAX = 64
DESCRIPTION_MAX = 280
METADATA_MAGIC = b"PSYMETAD"
_ACCOUNT = struct.Struct("<8sHH4xQQ64s280s")  # RunMetadata of programs/run_metadata.h
METADATA_SIZE = _ACCOUNT.size
_HEAD = struct.Struct("<HHQQ")                 # the instruction's fixed part
U64_MAX = 2**64 - 1


@dataclass(frozen=True)
class RunMetadata:
    name: str = ""
    description: str = ""
    num_parameters: int = 0
    vocab_size: int = 0

    def problems(self) -> list[str]:
        """Why the program would refuse this metadata (empty: it would not)."""
        out = []
        for field, text, limit in (("name", self.name, NAME_MAX),
                                   ("description", self.description, DESCRIPTION_MAX)):
            try:
                size = len(text.encode())
            except UnicodeEncodeError:
                out.append(f"--{field} is not valid UTF-8 text")
                continue
            if size > limit:
                out.append(f"--{field} is {size} bytes of UTF-8, at most {limit}")
        for field, number in (("num-parameters", self.num_parameters),
                              ("vocab-size", self.vocab_size)):
            if not 0 <= number <= U64_MAX:
                out.append(f"--{field} must be 0 to {U64_MAX}, got {number}")
        return out

    def as_json(self) -> dict[str, object]:
        """Psyche's json-dump-run `setup.metadata`."""
        return asdict(self)


def metadata_address(coordinator_account: Pubkey) -> Pubkey:
    address, _bump = Pubkey.find_program_address(
        [b"metadata", bytes(coordinator_account)], coordinator_program())
    return address


def decode_metadata(data: bytes) -> RunMetadata | None:
    """The metadata account's contents, or None if `data` is not one."""
    if len(data) != METADATA_SIZE or data[:8] != METADATA_MAGIC:
        return None
    _magic, name_len, description_len, parameters, vocab, name, description = \
        _ACCOUNT.unpack(data)
    # the program checks both are UTF-8; replace rather than fail on a forged account
    return RunMetadata(name[:min(name_len, NAME_MAX)].decode(errors="replace"),
                       description[:min(description_len, DESCRIPTION_MAX)].decode(errors="replace"),
                       parameters, vocab)


async def read_metadata(rpc: SolanaRpc, coordinator_account: Pubkey) -> RunMetadata | None:
    """The run's metadata, or None if it was never set."""
    data = await rpc.account_data(metadata_address(coordinator_account))
    return decode_metadata(data) if data else None


def _payload(metadata: RunMetadata) -> bytes:
    if problems := metadata.problems():
        raise ValueError("; ".join(problems))
    name, description = metadata.name.encode(), metadata.description.encode()
    return _HEAD.pack(len(name), len(description), metadata.num_parameters,
                      metadata.vocab_size) + name + description


def set_run_metadata(coordinator_account: Pubkey, authority: Pubkey, payer: Pubkey,
                     metadata: RunMetadata) -> Instruction:
    """Coordinator instruction 13: the main authority sets the metadata, `payer` funds
    its account the first time."""
    return Instruction(coordinator_program(), b"\x0d" + _payload(metadata), [
        AccountMeta(coordinator_account, False, False), AccountMeta(authority, True, False),
        AccountMeta(payer, True, True),
        AccountMeta(metadata_address(coordinator_account), False, True),
        AccountMeta(SYSTEM_PROGRAM_ID, False, False)])


def treasurer_run_set_metadata(authority: Pubkey, index: int, coordinator_account: Pubkey,
                               metadata: RunMetadata) -> Instruction:
    """Treasurer instruction 3: the Run's main authority sets (and funds) the metadata of
    the Run's coordinator, which the Run PDA signs."""
    return Instruction(treasurer_program(), b"\x03" + _payload(metadata), [
        AccountMeta(authority, True, True), AccountMeta(treasurer_run_address(index), False, False),
        AccountMeta(coordinator_account, False, False),
        AccountMeta(metadata_address(coordinator_account), False, True),
        AccountMeta(coordinator_program(), False, False),
        AccountMeta(SYSTEM_PROGRAM_ID, False, False)])


def treasurer_run_close(authority: Pubkey, index: int, coordinator_account: Pubkey,
                        run_id: str) -> Instruction:
    """Treasurer instruction 4: free_coordinator of a halted treasurer run, the rent of
    its state, claim and metadata to the Run's main authority."""
    return Instruction(treasurer_program(), b"\x04", [
        AccountMeta(authority, True, True), AccountMeta(treasurer_run_address(index), False, False),
        AccountMeta(coordinator_account, False, True),
        AccountMeta(coordinator_instance_address(run_id), False, True),
        AccountMeta(metadata_address(coordinator_account), False, True),
        AccountMeta(coordinator_program(), False, False)])


async def metadata_of_runs(rpc: SolanaRpc, runs: Sequence[Pubkey]) -> dict[Pubkey, RunMetadata]:
    """The metadata of each of `runs` that has one, in one getProgramAccounts call. An
    account counts only at its run's PDA address: anyone can create an account of this
    size owned by the program, but not at that address."""
    found = dict(await rpc.program_accounts(coordinator_program(), METADATA_SIZE,
                                            [(0, METADATA_MAGIC)]))
    out = {}
    for run in runs:
        data = found.get(metadata_address(run))
        metadata = decode_metadata(data) if data else None
        if metadata is not None:
            out[run] = metadata
    return out
