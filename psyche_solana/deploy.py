"""Deploying a program through the real upgradeable BPF loader, the way `solana program
deploy` does: a buffer account, the .so written in chunks that each fit a 1232-byte
transaction, then DeployWithMaxDataLen (which creates the ProgramData account).

Loader instructions are bincode: variant u32 LE, then fields.
    0 InitializeBuffer                 [buffer w, authority]
    1 Write {offset u32, bytes Vec}    [buffer w, authority s]
    2 DeployWithMaxDataLen {u64}       [payer s w, programdata w, program w, buffer w,
                                        rent sysvar, clock sysvar, system, authority s]
`deployment_transactions` returns the instruction groups with their extra signers, so the
same plan runs against LiteSVM (localnet) or a real cluster's RPC.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from solders.system_program import CreateAccountParams, create_account
from solders.sysvar import CLOCK, RENT

from psyche_solana.ids import SYSTEM_PROGRAM_ID

UPGRADEABLE_LOADER_ID = Pubkey.from_string("BPFLoaderUpgradeab1e11111111111111111111111")
BUFFER_METADATA_SIZE = 37
PROGRAM_ACCOUNT_SIZE = 36
PROGRAMDATA_METADATA_SIZE = 45
WRITE_CHUNK = 900

Step = tuple[list[Instruction], list[Keypair]]


def programdata_address(program: Pubkey) -> Pubkey:
    address, _ = Pubkey.find_program_address([bytes(program)], UPGRADEABLE_LOADER_ID)
    return address


def deployment_transactions(payer: Pubkey, program: Keypair, so: bytes, authority: Keypair,
                            rent: Callable[[int], int]) -> list[Step]:
    """Every transaction of one deployment, in order (each a list of instructions plus the
    keypairs besides the payer that sign it). `rent(size)` gives rent-exempt lamports."""
    buffer = Keypair()
    buffer_size = BUFFER_METADATA_SIZE + len(so)
    steps: list[Step] = [([
        create_account(CreateAccountParams(
            from_pubkey=payer, to_pubkey=buffer.pubkey(), lamports=rent(buffer_size),
            space=buffer_size, owner=UPGRADEABLE_LOADER_ID)),
        Instruction(UPGRADEABLE_LOADER_ID, struct.pack("<I", 0), [
            AccountMeta(buffer.pubkey(), False, True),
            AccountMeta(authority.pubkey(), False, False)])], [buffer])]
    for offset in range(0, len(so), WRITE_CHUNK):
        chunk = so[offset:offset + WRITE_CHUNK]
        steps.append(([Instruction(
            UPGRADEABLE_LOADER_ID, struct.pack("<IIQ", 1, offset, len(chunk)) + chunk, [
                AccountMeta(buffer.pubkey(), False, True),
                AccountMeta(authority.pubkey(), True, False)])], [authority]))
    max_data_len = 2 * len(so)  # room for upgrades
    steps.append(([
        create_account(CreateAccountParams(
            from_pubkey=payer, to_pubkey=program.pubkey(), lamports=rent(PROGRAM_ACCOUNT_SIZE),
            space=PROGRAM_ACCOUNT_SIZE, owner=UPGRADEABLE_LOADER_ID)),
        Instruction(UPGRADEABLE_LOADER_ID, struct.pack("<IQ", 2, max_data_len), [
            AccountMeta(payer, True, True),
            AccountMeta(programdata_address(program.pubkey()), False, True),
            AccountMeta(program.pubkey(), False, True),
            AccountMeta(buffer.pubkey(), False, True),
            AccountMeta(RENT, False, False), AccountMeta(CLOCK, False, False),
            AccountMeta(SYSTEM_PROGRAM_ID, False, False),
            AccountMeta(authority.pubkey(), True, False)])], [program, authority]))
    return steps


def deploy(send: Callable[[Sequence[Instruction], Sequence[Keypair]], object],
           payer: Pubkey, program: Keypair, so: bytes, authority: Keypair,
           rent: Callable[[int], int]) -> None:
    """Run a deployment with `send(instructions, extra_signers)`."""
    for instructions, signers in deployment_transactions(payer, program, so, authority, rent):
        send(instructions, signers)
