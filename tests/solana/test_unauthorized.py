"""Every instruction of the coordinator, authorizer and treasurer programs, sent by someone
it must refuse (a non-authority, a non-member, a squatter of a run id, a replayed claim,
a forged, misplaced or foreign account, oversized data): each is refused on-chain with
its NAMED program error and leaves every account of the programs byte for byte as it was.

One world (runs in several states, authorizations, a treasurer run with claimed and
unclaimed rewards) is built once for the module; each case is one transaction against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

import pytest
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from coordinator import NodeIdentity, RunState, Witness, WitnessProof
from coordinator.committee import Committee, CommitteeProof
from coordinator.config import CoordinatorConfig, HubCheckpoint, LLMConfig, StateFile
from psyche_solana import instructions as ix
from psyche_solana.accounts import COORDINATOR_ACCOUNT_SIZE
from psyche_solana.errors import error_name
from psyche_solana.ids import (
    SYSTEM_PROGRAM_ID,
    TOKEN_PROGRAM_ID,
    authorizer_program,
    coordinator_program,
    treasurer_program,
)
from psyche_solana.run_metadata import RunMetadata as Meta
from psyche_solana.run_metadata import set_run_metadata
from psyche_solana.run_metadata import treasurer_run_close as close
from psyche_solana.run_metadata import treasurer_run_set_metadata as set_metadata
from psyche_solana.scenario import SvmRun
from psyche_solana.svm import ProgramSvm, TransactionFailed
from tests.solana.refusals import unsigned, with_account
from tests.solana.test_differential import small_run_state

# the world is built in about a second and every case is one transaction: a minute is
# a hang, not a slow machine
pytestmark = pytest.mark.timeout(60)


def _named(state_file: StateFile, run_id: str) -> StateFile:
    return state_file.model_copy(update={"run_id": run_id})


@dataclass
class World:
    svm: ProgramSvm
    run: SvmRun            # "guarded-run": RoundTrain, `member` joined by its own authorization
    halted: SvmRun         # "halted-run": config and model set, never resumed (Uninitialized)
    paused: SvmRun         # "paused-run": resumed, then paused
    treasury: SvmRun       # treasurer run, played to its end (Finished)
    member: Keypair        # in `run` and `treasury`; claimed all its treasury points
    delegate: Keypair      # the member's delegate in `treasury`; claimed nothing yet
    intruder: Keypair      # in nothing; owns its own (permissionless) authorization
    member_auth: Pubkey    # join authority of `run` -> member
    intruder_auth: Pubkey  # intruder -> zero key
    blank: Pubkey          # a coordinator-sized account of the program, never initialized
    honest: Witness        # the member's witness for `run`'s current round

    def mint(self) -> Pubkey:
        assert self.treasury.mint is not None
        return self.treasury.mint.pubkey()

    def run_pda(self) -> Pubkey:
        assert self.treasury.treasurer_index is not None
        return ix.treasurer_run_address(self.treasury.treasurer_index)


@pytest.fixture(scope="module")
def world() -> World:
    svm = ProgramSvm()
    member, delegate, intruder = Keypair(), Keypair(), Keypair()
    for key in (member, delegate, intruder):
        svm.airdrop(key.pubkey(), 10**10)

    treasury = SvmRun.create(_named(small_run_state(2, 2, 1, 10), "treasury-run"), svm, treasurer=True)
    granted = treasury.authorize(member.pubkey(), [delegate], grantee_keypair=member)
    treasury.set_rates(1000, None)
    treasury.join(member, granted)
    treasury.join(delegate, granted)
    svm.advance(2)
    treasury.tick()
    treasury.play_epoch([member, delegate])
    assert treasury.account().earned(delegate.pubkey()) == 500
    treasury.top_up(1000)
    treasury.claim(member, 500)
    assert treasury.account().run_state is RunState.Finished
    mint = treasury.mint.pubkey() if treasury.mint else Pubkey.default()
    for user in (delegate, intruder):
        svm.send([ix.create_associated_token_account(user.pubkey(), user.pubkey(), mint)], [user])

    halted = SvmRun.create(_named(small_run_state(1, 1, 0, 4), "halted-run"), svm, start=False)
    paused = SvmRun.create(_named(small_run_state(1, 1, 0, 4), "paused-run"), svm)
    paused.set_paused(True)
    run = SvmRun.create(_named(small_run_state(1, 1, 1, 4), "guarded-run"), svm)
    member_auth = run.authorize(member.pubkey())
    run.join(member, member_auth)
    svm.advance(2)
    run.tick()
    warmup = run.honest_witness(member, warmup=True)
    assert warmup is not None
    run.warmup_witness(member, warmup)
    assert run.account().run_state is RunState.RoundTrain
    honest = run.honest_witness(member)
    assert honest is not None
    svm.send([ix.set_p2p_address(run.address, member.pubkey(), "member-p2p")], [member])

    intruder_auth = ix.authorization_address(intruder.pubkey(), Pubkey.default())
    svm.send([ix.authorization_create(intruder.pubkey(), intruder.pubkey(), Pubkey.default()),
              ix.authorization_grantor_update(intruder.pubkey(), intruder_auth, True)], [intruder])
    blank = Keypair()
    rent = svm.svm.minimum_balance_for_rent_exemption(COORDINATOR_ACCOUNT_SIZE)
    svm.send([ix.create_coordinator_account(svm.payer.pubkey(), blank.pubkey(), rent)], [blank])
    return World(svm, run, halted, paused, treasury, member, delegate, intruder, member_auth,
                 intruder_auth, blank.pubkey(), honest)


def _snapshot(svm: ProgramSvm) -> dict[Pubkey, tuple[Pubkey, int, bytes]]:
    """Owner, lamports and data of every account of our programs and of the token program
    (mints, vaults, users' token accounts)."""
    programs = (coordinator_program(), authorizer_program(), treasurer_program(), TOKEN_PROGRAM_ID)
    return {address: (account.owner, account.lamports, bytes(account.data))
            for program in programs for address, account in svm.svm.get_program_accounts(program)}


def _raw(program: Pubkey, data: bytes, *metas: tuple[Pubkey, bool, bool]) -> Instruction:
    """An instruction as an attacker writes it: (key, signer, writable) accounts."""
    return Instruction(program, data, [AccountMeta(k, s, w) for k, s, w in metas])


def _longer(instruction: Instruction, extra: bytes = b"\0") -> Instruction:
    return Instruction(instruction.program_id, bytes(instruction.data) + extra,
                       list(instruction.accounts))


Build = Callable[[World], tuple[list[Instruction], list[Keypair]]]


def _as(who: str, make: Callable[[World], Instruction | list[Instruction]]) -> Build:
    """The transaction `make` builds, signed by the world's keypair at the path `who`
    (e.g. "intruder", "run.authority"; "svm.payer" when only the fee payer signs)."""
    def build(w: World) -> tuple[list[Instruction], list[Keypair]]:
        made = make(w)
        return (made if isinstance(made, list) else [made]), [attrgetter(who)(w)]
    return build


def _me(w: World) -> Pubkey:
    return w.intruder.pubkey()


def _config(w: World) -> CoordinatorConfig:
    state = w.run.account().state
    assert state is not None
    return state.config


def _model(w: World) -> LLMConfig:
    state = w.run.account().state
    assert state is not None
    return state.model


def _init(w: World, account: Pubkey, run_id: str) -> Instruction:
    return ix.init_coordinator(account, w.intruder.pubkey(), run_id, _me(w), _me(w), "v")


def _create(w: World, run_id: str, index: int) -> Instruction:
    return ix.treasurer_run_create(w.intruder.pubkey(), index, w.blank, run_id, _me(w), _me(w),
                                   "v", w.mint())


def _claim(w: World, user: Keypair, points: int, coordinator: Pubkey | None = None) -> Instruction:
    assert w.treasury.treasurer_index is not None
    return ix.treasurer_claim(user.pubkey(), w.treasury.treasurer_index,
                              coordinator or w.treasury.address, w.mint(), points)


CASES: list[tuple[str, str, Build]] = [
    # the main authority's instructions, by anyone else
    ("update-config", "NotMainAuthority",
     _as("intruder", lambda w: ix.update_config(w.halted.address, _me(w), _config(w)))),
    ("update-model", "NotMainAuthority",
     _as("intruder", lambda w: ix.update_model(w.halted.address, _me(w), _model(w))[0])),
    ("update-client-version", "NotMainAuthority",
     _as("intruder", lambda w: ix.update_client_version(w.halted.address, _me(w), "evil"))),
    ("update-progress", "NotMainAuthority",
     _as("intruder", lambda w: ix.update_progress(w.halted.address, _me(w), 5, 9, 0))),
    ("update-join-authority", "NotMainAuthority",
     _as("intruder", lambda w: ix.update_join_authority(w.run.address, _me(w), _me(w)))),
    ("pause", "NotMainAuthority", _as("intruder", lambda w: ix.set_paused(w.run.address, _me(w), True))),
    ("resume", "NotMainAuthority",
     _as("intruder", lambda w: ix.set_paused(w.paused.address, _me(w), False))),
    ("set-future-epoch-rates", "NotMainAuthority",
     _as("intruder", lambda w: ix.set_future_epoch_rates(w.run.address, _me(w), 10**9, 0))),
    ("accept-model-loss", "NotMainAuthority",
     _as("intruder", lambda w: ix.accept_model_loss(w.paused.address, _me(w)))),
    ("free-coordinator", "NotMainAuthority",
     _as("intruder", lambda w: ix.free_coordinator(w.paused.address, _me(w), "paused-run", _me(w)))),
    ("set-run-metadata", "NotMainAuthority",
     _as("intruder", lambda w: set_run_metadata(w.run.address, _me(w), _me(w), Meta("evil")))),
    ("free-coordinator-running", "NotHalted", _as("run.authority", lambda w: ix.free_coordinator(
        w.run.address, w.run.authority.pubkey(), "guarded-run", w.run.authority.pubkey()))),
    ("authority-listed-not-signing", "MissingSignature", _as("svm.payer", lambda w: unsigned(
        ix.set_paused(w.run.address, w.run.authority.pubkey(), True), w.run.authority.pubkey()))),
    ("treasury-authority-direct", "NotMainAuthority", _as("treasury.authority", lambda w: ix.set_paused(
        w.treasury.address, w.treasury.authority.pubkey(), False))),
    ("treasury-pda-not-signing", "MissingSignature", _as("svm.payer", lambda w: unsigned(
        ix.set_paused(w.treasury.address, w.run_pda(), False), w.run_pda()))),
    ("config-change-while-running", "NotHalted",
     _as("run.authority", lambda w: ix.update_config(w.run.address, w.run.authority.pubkey(), _config(w)))),
    # the treasurer's forwarding
    ("run-update", "NotMainAuthority", _as("intruder", lambda w: ix.treasurer_run_update(
        _me(w), w.treasury.treasurer_index or 0, w.treasury.address,
        ix.set_paused(w.treasury.address, _me(w), False)))),
    ("run-set-metadata", "NotMainAuthority", _as("intruder", lambda w: set_metadata(
        _me(w), w.treasury.treasurer_index or 0, w.treasury.address, Meta("evil")))),
    ("run-close", "NotMainAuthority", _as("intruder", lambda w: close(
        _me(w), w.treasury.treasurer_index or 0, w.treasury.address, "treasury-run"))),
    # forwarded to the coordinator, which has nothing to accept (the loss is not refused
    # by the treasurer: a treasurer run's authority can accept it)
    ("run-update-accept-model-loss", "WrongRunState", _as("treasury.authority", lambda w:
        ix.treasurer_run_update(w.treasury.authority.pubkey(), w.treasury.treasurer_index or 0,
                                w.treasury.address,
                                ix.accept_model_loss(w.treasury.address, w.run_pda())))),
    ("run-update-not-admin", "NotAdminInstruction", _as("treasury.authority", lambda w: _raw(
        treasurer_program(), b"\x01\x05", (w.treasury.authority.pubkey(), True, False),
        (w.run_pda(), False, False), (w.treasury.address, False, True),
        (coordinator_program(), False, False)))),
    ("run-update-other-run", "WrongAccount", _as("treasury.authority", lambda w: ix.treasurer_run_update(
        w.treasury.authority.pubkey(), w.treasury.treasurer_index or 0, w.run.address,
        ix.set_paused(w.run.address, w.run_pda(), True)))),
    # joining
    ("join-unauthorized-key", "NotAuthorized",
     _as("intruder", lambda w: ix.join_run(w.run.address, _me(w), w.member_auth))),
    ("join-own-authorization", "NotAuthorized",
     _as("intruder", lambda w: ix.join_run(w.run.address, _me(w), w.intruder_auth))),
    ("join-missing-authorization", "NotAuthorized", _as("intruder", lambda w: ix.join_run(
        w.run.address, _me(w), ix.authorization_address(w.run.join_authority.pubkey(), Pubkey.default())))),
    ("join-forged-authorization", "NotAuthorized",
     _as("intruder", lambda w: ix.join_run(w.run.address, _me(w), w.halted.address))),
    ("join-as-member-not-signing", "MissingSignature", _as("svm.payer", lambda w: unsigned(
        ix.join_run(w.run.address, w.member.pubkey(), w.member_auth), w.member.pubkey()))),
    # the members' instructions, by a non-member
    ("witness", "NotYourIndex", _as("intruder", lambda w: ix.witness(w.run.address, _me(w), w.honest))),
    ("forged-witness-proof", "InvalidWitnessProof", _as("member", lambda w: ix.witness(
        w.run.address, w.member.pubkey(), Witness(
            WitnessProof(w.honest.proof.position + 1, w.honest.proof.index, True),
            w.honest.participant_bloom, w.honest.broadcast_bloom, bytes(32))))),
    ("health-check", "NotAClient", _as("intruder", lambda w: ix.health_check(
        w.run.address, _me(w), NodeIdentity(bytes(w.member.pubkey())),
        CommitteeProof(Committee.Trainer, 0, 0)))),
    ("checkpoint", "NotYourIndex", _as("intruder", lambda w: ix.checkpoint(
        w.run.address, _me(w), 0, HubCheckpoint(repo_id="evil/model", revision=None)))),
    ("p2p-address-of-another", "WrongAccount", _as("intruder", lambda w: with_account(
        ix.set_p2p_address(w.run.address, _me(w), "evil"), 2,
        ix.p2p_address_account(w.run.address, w.member.pubkey())))),
    # tick: anyone, except on a halted run or a wrong account
    ("tick-uninitialized-run", "Halted", _as("svm.payer", lambda w: ix.tick(w.halted.address))),
    ("tick-paused-run", "Halted", _as("svm.payer", lambda w: ix.tick(w.paused.address))),
    ("tick-finished-run", "Halted", _as("svm.payer", lambda w: ix.tick(w.treasury.address))),
    ("tick-blank-account", "NotInitialized", _as("svm.payer", lambda w: ix.tick(w.blank))),
    ("tick-wrong-owner", "WrongAccountOwner", _as("svm.payer", lambda w: ix.tick(_me(w)))),
    ("tick-run-id-claim", "WrongAccountSize", _as("svm.payer", lambda w: ix.tick(w.run.instance))),
    ("tick-read-only", "AccountNotWritable", _as("svm.payer", lambda w: _raw(
        coordinator_program(), b"\x05", (w.run.address, False, False)))),
    ("join-accounts-swapped", "WrongAccountOwner", _as("member", lambda w: _raw(
        coordinator_program(), b"\x04", (w.member.pubkey(), True, False),
        (w.run.address, False, True), (w.member_auth, False, False)))),
    # run ids: claimed once, by the PDA of the id
    ("duplicate-run-id", "AlreadyInitialized", _as("intruder", lambda w: _init(w, w.blank, "guarded-run"))),
    ("reinit-a-run", "AlreadyInitialized", _as("intruder", lambda w: _init(w, w.run.address, "fresh-id"))),
    ("claim-not-the-pda-of-the-id", "WrongAccount", _as("intruder", lambda w: with_account(
        _init(w, w.blank, "fresh-id"), 2, ix.coordinator_instance_address("other-id")))),
    ("non-canonical-run-id", "InvalidRunId", _as("intruder", lambda w: _raw(
        coordinator_program(), b"\0" + b"abc\0xyz".ljust(32, b"\0") + bytes(64 + 96),
        (w.blank, False, True), (w.intruder.pubkey(), True, True),
        (ix.coordinator_instance_address("abc"), False, True), (SYSTEM_PROGRAM_ID, False, False)))),
    ("init-payer-not-signing", "MissingSignature", _as("svm.payer", lambda w: unsigned(
        _init(w, w.blank, "fresh-id"), w.intruder.pubkey()))),
    ("treasurer-duplicate-run-id", "AlreadyInitialized",
     _as("intruder", lambda w: _create(w, "guarded-run", 12345))),
    ("treasurer-taken-index", "AlreadyInitialized",
     _as("intruder", lambda w: _create(w, "fresh-id", w.treasury.treasurer_index or 0))),
    # rewards
    ("claim-replayed", "NothingToClaim", _as("member", lambda w: _claim(w, w.member, 500))),
    ("claim-doubled", "NothingToClaim",
     _as("delegate", lambda w: [_claim(w, w.delegate, 500), _claim(w, w.delegate, 500)])),
    ("claim-too-large", "ClaimTooLarge", _as("delegate", lambda w: _claim(w, w.delegate, 501))),
    ("claim-non-member", "NothingToClaim", _as("intruder", lambda w: _claim(w, w.intruder, 1))),
    ("claim-into-anothers-participant", "WrongAccount", _as("intruder", lambda w: with_account(
        _claim(w, w.intruder, 500), 3, ix.participant_address(w.run_pda(), w.delegate.pubkey())))),
    ("claim-from-a-foreign-vault", "WrongVault", _as("delegate", lambda w: with_account(
        _claim(w, w.delegate, 500), 4, ix.associated_token_address(_me(w), w.mint())))),
    ("claim-on-another-coordinator", "WrongAccount",
     _as("delegate", lambda w: _claim(w, w.delegate, 500, w.run.address))),
    # authorizations
    ("authorization-deactivate", "NotGrantor",
     _as("intruder", lambda w: ix.authorization_grantor_update(_me(w), w.member_auth, False))),
    ("authorization-close", "NotGrantor",
     _as("intruder", lambda w: ix.authorization_close(_me(w), w.member_auth, _me(w)))),
    ("authorization-delegates-by-grantor", "NotGrantee", _as("run.join_authority", lambda w: (
        ix.authorization_grantee_update(w.run.join_authority.pubkey(), w.member_auth, True)))),
    ("authorization-forged-grantor", "MissingSignature", _as("intruder", lambda w: unsigned(
        ix.authorization_create(_me(w), w.run.join_authority.pubkey(), _me(w)),
        w.run.join_authority.pubkey()))),
    ("authorization-duplicate", "AlreadyInitialized", _as("run.join_authority", lambda w: ix.authorization_create(
        w.run.join_authority.pubkey(), w.run.join_authority.pubkey(), w.member.pubkey()))),
    ("authorization-wrong-address", "WrongAccount", _as("intruder", lambda w: with_account(
        ix.authorization_create(_me(w), _me(w), w.member.pubkey()), 2, w.intruder_auth))),
    ("authorization-wrong-owner", "WrongAccountOwner",
     _as("intruder", lambda w: ix.authorization_grantor_update(_me(w), w.run.address, True))),
]

# malformed or oversized data, each sent by the one who may send that instruction
MALFORMED: list[tuple[str, Build]] = [
    ("coordinator-empty", _as("svm.payer", lambda w: _raw(coordinator_program(), b"", (w.run.address, False, True)))),
    ("coordinator-unknown-tag", _as("member", lambda w: _raw(
        coordinator_program(), b"\x63", (w.run.address, False, True), (w.member.pubkey(), True, False)))),
    ("init-longer", _as("intruder", lambda w: _longer(_init(w, w.blank, "fresh-id")))),
    ("update-config-longer", _as("halted.authority", lambda w: _longer(
        ix.update_config(w.halted.address, w.halted.authority.pubkey(), _config(w))))),
    ("update-unknown-kind", _as("halted.authority", lambda w: _raw(
        coordinator_program(), b"\x01\x09", (w.halted.address, False, True),
        (w.halted.authority.pubkey(), True, False)))),
    ("set-run-metadata-longer", _as("run.authority", lambda w: _longer(set_run_metadata(
        w.run.address, w.run.authority.pubkey(), w.run.authority.pubkey(), Meta("x"))))),
    ("set-paused-longer", _as("run.authority", lambda w: _longer(ix.set_paused(w.run.address, w.run.authority.pubkey(), True)))),
    ("set-rates-longer", _as("run.authority", lambda w: _longer(
        ix.set_future_epoch_rates(w.run.address, w.run.authority.pubkey(), 1, 1)))),
    ("join-longer", _as("member", lambda w: _longer(ix.join_run(w.run.address, w.member.pubkey(), w.member_auth)))),
    ("tick-longer", _as("svm.payer", lambda w: _longer(ix.tick(w.run.address)))),
    ("witness-longer", _as("member", lambda w: _longer(ix.witness(w.run.address, w.member.pubkey(), w.honest)))),
    ("witness-short", _as("member", lambda w: _raw(
        coordinator_program(), b"\x07" + bytes(10), (w.run.address, False, True), (w.member.pubkey(), True, False)))),
    ("health-check-longer", _as("member", lambda w: _longer(ix.health_check(
        w.run.address, w.member.pubkey(), NodeIdentity(bytes(w.member.pubkey())),
        CommitteeProof(Committee.Trainer, 0, 0))))),
    ("checkpoint-longer", _as("member", lambda w: _longer(ix.checkpoint(
        w.run.address, w.member.pubkey(), 0, HubCheckpoint(repo_id="a/b", revision=None))))),
    ("p2p-address-oversized", _as("member", lambda w: _longer(
        ix.set_p2p_address(w.run.address, w.member.pubkey(), "x" * ix.P2P_ADDRESS_MAX)))),
    ("authorizer-empty", _as("intruder", lambda w: _raw(authorizer_program(), b"", (_me(w), True, False)))),
    ("authorization-create-scope-mismatch", _as("intruder", lambda w: _longer(
        ix.authorization_create(_me(w), _me(w), w.member.pubkey())))),
    ("authorization-update-longer", _as("run.join_authority", lambda w: _longer(
        ix.authorization_grantor_update(w.run.join_authority.pubkey(), w.member_auth, True)))),
    ("authorization-delegates-mismatch", _as("member", lambda w: _longer(
        ix.authorization_grantee_update(w.member.pubkey(), w.member_auth, False, [w.delegate.pubkey()])))),
    ("authorization-unknown-tag", _as("run.join_authority", lambda w: _raw(
        authorizer_program(), b"\x09", (w.run.join_authority.pubkey(), True, False),
        (w.member_auth, False, True)))),
    ("treasurer-empty", _as("intruder", lambda w: _raw(treasurer_program(), b"", (_me(w), True, False)))),
    ("treasurer-unknown-tag", _as("intruder", lambda w: _raw(treasurer_program(), b"\x07", (_me(w), True, False)))),
    ("treasurer-create-longer", _as("intruder", lambda w: _longer(_create(w, "fresh-id", 777)))),
    ("run-close-longer", _as("treasury.authority", lambda w: _longer(close(
        w.treasury.authority.pubkey(), w.treasury.treasurer_index or 0, w.treasury.address, "treasury-run")))),
    ("claim-longer", _as("delegate", lambda w: _longer(_claim(w, w.delegate, 1)))),
]


def _refused(world: World, build: Build) -> str:
    instructions, signers = build(world)
    before = _snapshot(world.svm)
    with pytest.raises(TransactionFailed) as caught:
        world.svm.send(instructions, signers)
    assert caught.value.code is not None, str(caught.value)
    assert _snapshot(world.svm) == before, "a refused transaction changed an account"
    return error_name(caught.value.code)


@pytest.mark.parametrize("build,expected", [pytest.param(b, e, id=n) for n, e, b in CASES])
def test_refused_with_its_named_error_and_no_account_changes(world: World, build: Build,
                                                             expected: str) -> None:
    assert _refused(world, build) == expected


@pytest.mark.parametrize("build", [pytest.param(b, id=n) for n, b in MALFORMED])
def test_malformed_or_oversized_data_is_refused_and_no_account_changes(world: World,
                                                                      build: Build) -> None:
    assert _refused(world, build) == "InvalidInstruction"


def test_an_oversized_transaction_never_reaches_the_chain(world: World) -> None:
    before = _snapshot(world.svm)
    with pytest.raises(TransactionFailed, match=r"too large: .* > 1232"):
        world.svm.send([ix.witness(world.run.address, world.member.pubkey(), world.honest)] * 3,
                       [world.member])
    assert _snapshot(world.svm) == before

