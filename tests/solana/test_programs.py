"""The three programs in LiteSVM: authorizations, a treasurer run paying rewards, and
every rejection the issue names, each with a clear message."""

from __future__ import annotations

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from coordinator import Bloom, RunState, Witness, WitnessProof
from psyche_solana import instructions as ix
from psyche_solana.accounts import decode_authorization, decode_participant, decode_treasurer_run
from psyche_solana.scenario import SvmRun
from psyche_solana.svm import TransactionFailed
from tests.solana.test_differential import _state_file


def _funded(run: SvmRun, n: int) -> list[Keypair]:
    keys = [Keypair() for _ in range(n)]
    for key in keys:
        run.svm.airdrop(key.pubkey(), 10**9)
    return keys


def test_treasurer_run_with_an_authorized_key_and_its_delegate_pays_rewards():
    run = SvmRun.create(_state_file(2, 2, 1, 10), treasurer=True)
    owner, delegate, stranger = _funded(run, 3)
    authorization = run.authorize(owner.pubkey(), [delegate], grantee_keypair=owner)
    assert decode_authorization(run.svm.data(authorization)).delegates == [delegate.pubkey()]
    run.set_rates(1000, None)
    run.join(owner, authorization)
    run.join(delegate, authorization)
    with pytest.raises(TransactionFailed, match="NotAuthorized"):
        run.join(stranger, authorization)
    run.svm.advance(2)
    run.tick()
    assert run.account().state.run_state is RunState.Warmup
    counts = run.play_epoch([owner, delegate])
    account = run.account()
    assert account.state.progress.epoch == 1 and counts["witness"] > 0
    assert account.earned(owner.pubkey()) == 500 == account.earned(delegate.pubkey())

    run.top_up(700)
    run.claim(owner, 500)
    assert run.token_balance(owner.pubkey()) == 500  # 1 base unit per point
    with pytest.raises(TransactionFailed, match="NothingToClaim"):
        run.claim(owner, 500)  # never twice
    with pytest.raises(TransactionFailed, match="ClaimTooLarge"):
        run.claim(delegate, 501)
    with pytest.raises(TransactionFailed, match=r"InsufficientFunds|custom program error: 0x1|error 1"):
        run.claim(delegate, 500)  # the vault holds only 200 more
    run.top_up(300)
    run.claim(delegate, 500)
    assert run.token_balance(delegate.pubkey()) == 500
    treasurer = decode_treasurer_run(run.svm.data(ix.treasurer_run_address(run.treasurer_index)))
    assert treasurer.total_claimed_earned_points == 1000
    participant = decode_participant(run.svm.data(ix.participant_address(
        ix.treasurer_run_address(run.treasurer_index), owner.pubkey())))
    assert participant.claimed_earned_points == 500


def test_update_by_a_non_authority_is_rejected():
    run = SvmRun.create(_state_file(1, 1, 0, 4), start=False)
    intruder = _funded(run, 1)[0]
    with pytest.raises(TransactionFailed, match="NotMainAuthority"):
        run.svm.send([ix.set_paused(run.address, intruder.pubkey(), False)], [intruder])
    treasurer_run = SvmRun.create(_state_file(1, 1, 0, 4), treasurer=True, start=False)
    with pytest.raises(TransactionFailed, match="NotMainAuthority"):
        treasurer_run.admin([ix.set_paused(treasurer_run.address, intruder.pubkey(), False)],
                            signer=intruder)
    # the authority can; then config changes need a paused run
    treasurer_run.set_paused(False)
    with pytest.raises(TransactionFailed, match="NotHalted"):
        treasurer_run.admin([ix.update_config(treasurer_run.address, treasurer_run.authority.pubkey(),
                                              _state_file(1, 1, 0, 4).config)])


def test_unauthorized_join_forged_witness_and_oversized_transaction_are_rejected():
    run = SvmRun.create(_state_file(1, 1, 1, 4))
    client, stranger = _funded(run, 2)
    granted = run.authorize(client.pubkey())
    with pytest.raises(TransactionFailed, match="NotAuthorized: no active join authorization"):
        run.join(stranger, granted)
    with pytest.raises(TransactionFailed, match="NotAuthorized"):
        run.join(stranger)  # no permissionless authorization exists
    run.join(client, granted)
    run.svm.advance(2)
    run.tick()
    run.warmup_witness(client, run.honest_witness(client, warmup=True))
    assert run.account().state.run_state is RunState.RoundTrain
    honest = run.honest_witness(client)
    forged = Witness(WitnessProof(honest.proof.position + 1, honest.proof.index, True),
                     honest.participant_bloom, honest.broadcast_bloom, bytes(32))
    with pytest.raises(TransactionFailed, match="InvalidWitnessProof"):
        run.witness(client, forged)
    with pytest.raises(TransactionFailed, match="NotYourIndex"):
        run.witness(stranger, honest)
    too_big = [ix.witness(run.address, client.pubkey(), honest)] * 3
    with pytest.raises(TransactionFailed, match=r"too large: .* > 1232"):
        run.svm.send(too_big, [client])
    run.witness(client, honest)
    assert run.account().state.run_state is RunState.RoundWitness


def test_authorization_delegates_and_delete():
    run = SvmRun.create(_state_file(1, 1, 0, 4))
    grantee, first, second = _funded(run, 3)
    address = run.authorize(grantee.pubkey(), [first, second], grantee_keypair=grantee)
    run.join(second, address)
    grantor = run.join_authority
    with pytest.raises(TransactionFailed, match="NotGrantee"):
        run.svm.send([ix.authorization_grantee_update(grantor.pubkey(), address, True)], [grantor])
    run.svm.send([ix.authorization_grantee_update(grantee.pubkey(), address, True)], [grantee])
    with pytest.raises(TransactionFailed, match="NotAuthorized"):
        run.join(first, address)  # delegates cleared
    with pytest.raises(TransactionFailed, match="AuthorizationActive"):
        run.svm.send([ix.authorization_close(grantor.pubkey(), address, grantor.pubkey())], [grantor])
    run.svm.send([ix.authorization_grantor_update(grantor.pubkey(), address, False),
                  ix.authorization_close(grantor.pubkey(), address, grantor.pubkey())], [grantor])
    assert run.svm.svm.get_account(address) is None
    with pytest.raises(TransactionFailed, match="NotAuthorized"):
        run.join(grantee, address)


@pytest.mark.parametrize("data,expected", [
    (b"", "InvalidInstruction"), (b"\x63", "InvalidInstruction"),
    (b"\x07" + bytes(10), "InvalidInstruction"), (b"\x04\x00", "InvalidInstruction")])
def test_malformed_instructions_are_refused_and_leave_the_state_alone(data, expected):
    from solders.instruction import AccountMeta, Instruction

    run = SvmRun.create(_state_file(1, 1, 0, 4))
    user = _funded(run, 1)[0]
    before = run.svm.data(run.address)
    bad = Instruction(ix.coordinator_program(), data, [
        AccountMeta(run.address, False, True), AccountMeta(user.pubkey(), True, False)])
    with pytest.raises(TransactionFailed, match=expected):
        run.svm.send([bad], [user])
    assert run.svm.data(run.address) == before


def test_builders_refuse_bad_values():
    with pytest.raises(ValueError, match="run_id is 40 bytes, at most 32"):
        ix.init_coordinator(Pubkey.default(), Pubkey.default(), "x" * 40, Pubkey.default(),
                            Pubkey.default(), "v")
    with pytest.raises(ValueError, match="only update, set_paused"):
        ix.treasurer_run_update(Pubkey.default(), 1, Pubkey.default(), ix.tick(Pubkey.default()))
    assert Bloom().contains(b"x") is False
