"""What the Solana tests check refusals with: a run-manager command that must fail in one
line, and the instructions an attacker forges from an honest one (a key listed but not
signing, one account swapped for another)."""

from __future__ import annotations

from click.testing import Result
from solders.instruction import AccountMeta, Instruction
from solders.pubkey import Pubkey


def one_line_error(result: Result, *words: str) -> None:
    """The command failed with one line of output, no traceback, naming every word."""
    assert result.exit_code != 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], result.output


def unsigned(instruction: Instruction, key: Pubkey) -> Instruction:
    """The same instruction with `key` listed but not signing."""
    metas = [AccountMeta(m.pubkey, False, m.is_writable) if m.pubkey == key else m
             for m in instruction.accounts]
    return Instruction(instruction.program_id, bytes(instruction.data), metas)


def with_account(instruction: Instruction, index: int, key: Pubkey) -> Instruction:
    """The same instruction with its account at `index` replaced by `key` (same flags)."""
    metas = list(instruction.accounts)
    metas[index] = AccountMeta(key, metas[index].is_signer, metas[index].is_writable)
    return Instruction(instruction.program_id, bytes(instruction.data), metas)
