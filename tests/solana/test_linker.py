"""Our linker: clang's relocatable eBPF objects become SBPFv0 programs LiteSVM runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from solders.instruction import Instruction
from solders.keypair import Keypair
from solders.litesvm import LiteSVM
from solders.message import Message
from solders.pubkey import Pubkey
from solders.transaction import Transaction

from psyche_solana.build import CFLAGS, build
from psyche_solana.linker import LinkError, link

PROGRAM = r"""
typedef unsigned long long u64;
void sol_log_(const char *, u64);
static const u64 table[4] = {7, 11, 13, 17};   /* lddw into .rodata */
__attribute__((noinline)) u64 global_helper(u64 x) { return x * 3; }   /* relocated call */
static __attribute__((noinline)) u64 local_helper(u64 x) { return x + table[x % 4]; }
u64 entrypoint(const unsigned char *input) {
  sol_log_("linked!", 7);                       /* syscall through .dynsym */
  u64 n = *(const u64 *)input;                  /* number of accounts: 0 */
  return global_helper(local_helper(n)) == 21 ? 0 : 1;
}
"""


def _compile(tmp_path: Path, source: str) -> bytes:
    if shutil.which("clang") is None:
        pytest.fail("clang is required (apt-get install -y clang lld llvm)")
    c_file = tmp_path / "prog.c"
    c_file.write_text(source)
    subprocess.run(["clang", *CFLAGS, "-c", str(c_file), "-o", str(tmp_path / "prog.o")],
                   check=True)
    return (tmp_path / "prog.o").read_bytes()


def test_a_linked_program_runs_in_litesvm(tmp_path):
    so = link(_compile(tmp_path, PROGRAM))
    assert so[:4] == b"\x7fELF" and so[16] == 3  # ET_DYN
    svm = LiteSVM()
    program, payer = Pubkey.new_unique(), Keypair()
    svm.add_program(program, so)
    svm.airdrop(payer.pubkey(), 10**9)
    tx = Transaction([payer], Message([Instruction(program, b"", [])], payer.pubkey()),
                     svm.latest_blockhash())
    result = svm.send_transaction(tx)
    assert not hasattr(result, "err"), result
    assert "Program log: linked!" in result.logs()


def test_mutable_globals_are_refused_with_a_clear_message(tmp_path):
    obj = _compile(tmp_path, "unsigned long long counter = 1;\n"
                   "unsigned long long entrypoint(void *i) { return counter++; }\n")
    with pytest.raises(LinkError, match=r"writable section \.data"):
        link(obj)


def test_garbage_is_not_an_object():
    with pytest.raises(LinkError, match="not a 64-bit little-endian ELF"):
        link(b"hello")


def test_build_is_idempotent():
    first = {name: path.stat().st_mtime_ns for name, path in build().items()}
    second = {name: path.stat().st_mtime_ns for name, path in build().items()}
    assert first == second and set(first) == {"coordinator", "authorizer", "treasurer", "distributor",
                                              "mining_pool"}
