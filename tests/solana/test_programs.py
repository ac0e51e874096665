"""The three programs in LiteSVM: authorizations and a treasurer run paying rewards.
Refusals (who may not do what) are in test_unauthorized.py."""

from __future__ import annotations

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from coordinator import Bloom, RunState
from psyche_solana import instructions as ix
from psyche_solana.accounts import (
    decode_authorization,
    decode_instance,
    decode_participant,
    decode_treasurer_run,
)
from psyche_solana.ids import coordinator_program
from psyche_solana.scenario import SvmRun
from psyche_solana.svm import ProgramSvm, TransactionFailed
from tests.solana.test_differential import small_run_state


def _funded(run: SvmRun, n: int) -> list[Keypair]:
    keys = [Keypair() for _ in range(n)]
    for key in keys:
        run.svm.airdrop(key.pubkey(), 10**9)
    return keys


def test_treasurer_run_with_an_authorized_key_and_its_delegate_pays_rewards():
    run = SvmRun.create(small_run_state(2, 2, 1, 10), treasurer=True)
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


def test_authorization_delegates_and_delete():
    run = SvmRun.create(small_run_state(1, 1, 0, 4))
    grantee, first, second = _funded(run, 3)
    address = run.authorize(grantee.pubkey(), [first, second], grantee_keypair=grantee)
    run.join(second, address)
    grantor = run.join_authority
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


def test_builders_refuse_bad_values():
    with pytest.raises(ValueError, match="run_id is 40 bytes, at most 32"):
        ix.init_coordinator(Pubkey.default(), Pubkey.default(), "x" * 40, Pubkey.default(),
                            Pubkey.default(), "v")
    with pytest.raises(ValueError, match="without NUL"):
        ix.coordinator_instance_address("a\0b")
    with pytest.raises(ValueError, match="only update, set_paused"):
        ix.treasurer_run_update(Pubkey.default(), 1, Pubkey.default(), ix.tick(Pubkey.default()))
    assert Bloom().contains(b"x") is False


def test_a_run_id_is_claimed_even_if_lamports_were_sent_to_its_address():
    """A transfer to the claim's address must not block the id: the program takes the
    system account over (top-up, allocate, assign) as Anchor's init does."""
    claim = ix.coordinator_instance_address("prefunded-run")
    svm = ProgramSvm()
    svm.airdrop(claim, 1_000_000)
    state_file = small_run_state(1, 1, 0, 4).model_copy(update={"run_id": "prefunded-run"})
    run = SvmRun.create(state_file, svm, start=False)
    assert run.instance == claim
    instance = decode_instance(svm.data(claim))
    assert (instance.coordinator_account, instance.run_id) == (run.address, "prefunded-run")
    account = svm.svm.get_account(claim)
    assert account is not None and account.owner == coordinator_program()
