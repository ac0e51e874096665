"""The run metadata PDA (coordinator instruction 13) and the treasurer's forwards of it
and of free_coordinator (treasurer instructions 3 and 4), in LiteSVM with the real
programs: only the main authority sets it, lengths and UTF-8 are checked on-chain, and
closing a run closes its metadata too, the rent going to the spill."""

from __future__ import annotations

import struct

import pytest
from solders.instruction import Instruction
from solders.keypair import Keypair

from coordinator import RunState
from psyche_solana import instructions as ix
from psyche_solana.run_metadata import (
    RunMetadata,
    decode_metadata,
    metadata_address,
    set_run_metadata,
    treasurer_run_close,
    treasurer_run_set_metadata,
)
from psyche_solana.scenario import SvmRun
from psyche_solana.svm import TransactionFailed
from tests.solana.test_differential import small_run_state

pytestmark = pytest.mark.timeout(120)
NICE = RunMetadata("Nice run ✓", "A 20M model on FineWeb", 20_000_000, 32_000)


def _raw_metadata(run: SvmRun, name: bytes, description: bytes,
                  declared_name_len: int | None = None) -> Instruction:
    """set_run_metadata with bytes the builder would refuse."""
    good = set_run_metadata(run.address, run.authority.pubkey(), run.authority.pubkey(), NICE)
    head = struct.pack("<HHQQ", len(name) if declared_name_len is None else declared_name_len,
                       len(description), 1, 2)
    return Instruction(good.program_id, b"\x0d" + head + name + description, list(good.accounts))


def _stored(run: SvmRun) -> RunMetadata | None:
    account = run.svm.svm.get_account(metadata_address(run.address))
    return None if account is None else decode_metadata(bytes(account.data))


def test_only_the_main_authority_sets_the_metadata_and_the_program_checks_it():
    run = SvmRun.create(small_run_state(1, 1, 0, 4))
    intruder = Keypair()
    run.svm.airdrop(intruder.pubkey(), 10**9)
    with pytest.raises(TransactionFailed, match="NotMainAuthority"):
        run.svm.send([set_run_metadata(run.address, intruder.pubkey(), intruder.pubkey(), NICE)],
                     [intruder])
    assert _stored(run) is None
    me = run.authority.pubkey()
    run.svm.send([set_run_metadata(run.address, me, me, NICE)], [run.authority])
    assert _stored(run) == NICE
    shorter = RunMetadata("x", "", 1, 2)  # the old, longer text must not show through
    run.svm.send([set_run_metadata(run.address, me, me, shorter)], [run.authority])
    assert _stored(run) == shorter
    # set while the run trains, too (Psyche's update takes metadata at any time)
    assert run.account().run_state is not RunState.Paused
    for name, description, declared, error in (
            (b"n" * 65, b"", None, "InvalidMetadata"),
            (b"", b"d" * 281, None, "InvalidMetadata"),
            (b"\xff\xfe", b"", None, "InvalidMetadata"),       # not UTF-8
            (b"\xe2\x9c", b"", None, "InvalidMetadata"),       # a truncated sequence
            (b"abc", b"", 5, "InvalidInstruction")):           # lengths and bytes disagree
        with pytest.raises(TransactionFailed, match=error):
            run.svm.send([_raw_metadata(run, name, description, declared)], [run.authority])
    assert _stored(run) == shorter
    other = SvmRun.create(small_run_state(1, 1, 0, 4).model_copy(update={"run_id": "other-run"}),
                          run.svm, start=False)
    with pytest.raises(TransactionFailed, match="WrongAccount"):  # another run's PDA
        good = set_run_metadata(run.address, me, me, NICE)
        accounts = list(good.accounts)
        accounts[3] = type(accounts[3])(metadata_address(other.address), False, True)
        run.svm.send([Instruction(good.program_id, bytes(good.data), accounts)], [run.authority])
    with pytest.raises(ValueError, match="--name is 65 bytes of UTF-8, at most 64"):
        set_run_metadata(run.address, me, me, RunMetadata(name="é" * 32 + "x"))


def test_free_coordinator_closes_the_metadata_and_refunds_its_rent():
    run = SvmRun.create(small_run_state(1, 1, 0, 4), start=False)
    me = run.authority.pubkey()
    run.svm.send([set_run_metadata(run.address, me, me, NICE)], [run.authority])
    spill = Keypair().pubkey()
    metadata_rent = run.svm.svm.get_account(metadata_address(run.address)).lamports
    state_rent = run.svm.svm.get_account(run.address).lamports
    claim_rent = run.svm.svm.get_account(run.instance).lamports
    instance = run.instance
    incomplete = ix.free_coordinator(run.address, me, run.account().run_id, spill)
    without_metadata = Instruction(incomplete.program_id, bytes(incomplete.data),
                                   list(incomplete.accounts)[:4])
    with pytest.raises(TransactionFailed, match="MissingAccount"):  # it cannot be left behind
        run.svm.send([without_metadata], [run.authority])
    foreign = list(incomplete.accounts)
    foreign[4] = type(foreign[4])(metadata_address(spill), False, True)  # not this run's PDA
    with pytest.raises(TransactionFailed, match="WrongAccount"):
        run.svm.send([Instruction(incomplete.program_id, bytes(incomplete.data), foreign)],
                     [run.authority])
    run.svm.send([incomplete], [run.authority])
    for address in (run.address, instance, metadata_address(run.address)):
        assert run.svm.svm.get_account(address) is None
    assert run.svm.svm.get_balance(spill) == metadata_rent + state_rent + claim_rent


def test_a_treasurer_run_sets_metadata_and_closes_through_the_treasurer():
    run = SvmRun.create(small_run_state(1, 1, 0, 4), treasurer=True)
    assert run.treasurer_index is not None
    owner, index = run.authority, run.treasurer_index
    intruder = Keypair()
    run.svm.airdrop(intruder.pubkey(), 10**9)
    with pytest.raises(TransactionFailed, match="NotMainAuthority"):
        run.svm.send([treasurer_run_set_metadata(intruder.pubkey(), index, run.address, NICE)],
                     [intruder])
    with pytest.raises(TransactionFailed, match="NotMainAuthority"):  # the Run PDA is the authority
        run.svm.send([set_run_metadata(run.address, owner.pubkey(), owner.pubkey(), NICE)], [owner])
    run.svm.send([treasurer_run_set_metadata(owner.pubkey(), index, run.address, NICE)], [owner])
    assert _stored(run) == NICE

    run_id = run.account().run_id
    with pytest.raises(TransactionFailed, match="NotHalted"):
        run.svm.send([treasurer_run_close(owner.pubkey(), index, run.address, run_id)], [owner])
    run.set_paused(True)
    with pytest.raises(TransactionFailed, match="NotMainAuthority"):
        run.svm.send([treasurer_run_close(intruder.pubkey(), index, run.address, run_id)],
                     [intruder])
    instance, before = run.instance, run.svm.svm.get_balance(owner.pubkey())
    rents = sum(run.svm.svm.get_account(a).lamports
                for a in (run.address, instance, metadata_address(run.address)))
    sent = run.svm.send([treasurer_run_close(owner.pubkey(), index, run.address, run_id)], [owner])
    assert sent.compute_units > 0
    for address in (run.address, instance, metadata_address(run.address)):
        assert run.svm.svm.get_account(address) is None
    # the fee is paid by the svm's payer: the owner gets every lamport of the three rents
    assert run.svm.svm.get_balance(owner.pubkey()) - before == rents
    assert run.svm.svm.get_account(ix.treasurer_run_address(index)) is not None  # the Run stays
