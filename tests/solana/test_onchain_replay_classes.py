"""Replay classes on chain (issue 36; docs/verification.md): join_run carries the client's
class (absent: 0), the registry keeps it and the warm-up copies it into the client entry;
the program's `follows` (programs/coordinator_machine.h) accepts a verification report
exactly from the followers of `coordinator.verification.plan_for_epoch`, the plan grouped
by class, for mixes of classes (of 2 and >= 3 members, class 0) under several seeds.
Every event goes through `coordinator.Coordinator` and through the program in LiteSVM and
both must agree (test_differential's Harness)."""

from __future__ import annotations

import asyncio
import copy
import math
from typing import Any

import pytest
from solders.instruction import Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from client_image.backends.solana import SolanaBackend, SolanaBackendOptions
from coordinator import ClientState, Coordinator, NodeIdentity, RunState
from coordinator.state import VerificationReport
from coordinator.verification import (
    FOLLOWERS_PER_TRAINER,
    class_shortfalls,
    epoch_members,
    follow_plan,
    plan_for_epoch,
)
from psyche_solana import instructions as ix
from psyche_solana.accounts import (
    COORDINATOR_ACCOUNT_SIZE,
    REPORTS_OFFSET,
    decode_coordinator,
)
from psyche_solana.errors import error_name
from psyche_solana.scenario import SvmRun
from psyche_solana.svm import TransactionFailed
from tests.solana.test_differential import small_run_state
from tests.solana.test_onchain_verification_reports import PERCENT, ReportHarness


class ClassHarness(ReportHarness):
    """ReportHarness whose clients join with a replay class: `classes[i]` is client i's
    (absent: 0) at its next join; Python's tick gets the pending joiners' classes as
    their last join gave them, as the program's registry keeps them; a joiner a warm-up
    does not list (not eligible) stays pending, as its registry entry does. A client in
    `explicit_zero` sends class 0 as two zero bytes instead of leaving it out."""

    def __init__(self, clients: list[Keypair], classes: dict[int, int], percent: int):
        super().__init__(clients, percent)
        self.classes = dict(classes)
        self.explicit_zero: set[int] = set()
        self.joined_class: dict[NodeIdentity, int] = {}

    def _python(self, event: tuple, now: int, seed: int) -> Any:
        if event[0] == "join":
            self.joined_class[self._client(event[1])[1]] = self.classes.get(event[1], 0)
        if event[0] == "tick":
            before = self.python.state.run_state
            pending = self.pending()
            classes = {node: self.joined_class[node] for node in pending}
            waiting = class_shortfalls(pending, classes,
                                       self.python.state.config.verification_percent)
            result = self.python.tick(pending, now, seed, classes)
            if before is RunState.WaitingForMembers and self.python.state.run_state is RunState.Warmup:
                self.next_active += 1
                self.registry = [(key, self.next_active if NodeIdentity(key) in waiting else active)
                                 for key, active in self.registry]
            return result
        return super()._python(event, now, seed)

    def _chain(self, event: tuple) -> None:
        if event[0] == "join" and event[1] in self.explicit_zero:
            self.svm.send([_join_instruction(self, event[1], b"\0\0")], [self.clients[event[1]]])
        elif event[0] == "join":
            self.run.join(self.clients[event[1]], replay_class=self.classes.get(event[1], 0))
        else:
            super()._chain(event)

    def node(self, i: int) -> NodeIdentity:
        return self._client(i)[1]


def _keys(first: int, n: int) -> list[Keypair]:
    return [Keypair.from_seed(bytes([first + i]) * 32) for i in range(n)]


def _trained(harness: ReportHarness) -> None:
    harness.until(lambda s: s.run_state is RunState.RoundTrain
                  and s.progress.step > s.epoch_state.start_step)


def _join_instruction(harness: ClassHarness, i: int, payload: bytes) -> Instruction:
    plain = ix.join_run(harness.run.address, harness.clients[i].pubkey(),
                        ix.authorization_address(harness.run.join_authority.pubkey(),
                                                 Pubkey.default()))
    return Instruction(plain.program_id, bytes(plain.data) + payload, list(plain.accounts))


def test_the_account_layout_ends_with_the_reports():
    """The registry entry grew to 48 bytes (ACCOUNT_VERSION 4): the offsets after it moved."""
    assert REPORTS_OFFSET + 32 * 144 == COORDINATOR_ACCOUNT_SIZE == 107688
    harness = ClassHarness(_keys(150, 1), {}, PERCENT)
    assert harness.run.account().version == 4


def test_a_joiners_class_is_kept_in_the_registry_and_copied_into_its_client_entry():
    # verification off: a warm-up lists every joiner, whatever its class
    harness = ClassHarness(_keys(150, 5), {0: 0xBEEF, 1: 3, 3: 3}, 0)
    run = harness.run
    # class 0 is the instruction without the class, byte for byte what older clients send
    assert bytes(ix.join_run(run.address, harness.clients[2].pubkey(), run.address).data) == b"\x04"
    assert bytes(ix.join_run(run.address, harness.clients[2].pubkey(), run.address, 0x0102).data) \
        == b"\x04\x02\x01"
    with pytest.raises(ValueError, match="u16"):
        ix.join_run(run.address, harness.clients[2].pubkey(), run.address, 0x10000)
    harness.explicit_zero.add(4)  # client 4 sends class 0 explicitly: the same as without
    for i in range(5):
        assert harness.apply(("join", i)) is None
    account = run.account()
    keys = [client.pubkey() for client in harness.clients]
    assert account.replay_classes == {keys[0]: 0xBEEF, keys[1]: 3, keys[2]: 0, keys[3]: 3,
                                      keys[4]: 0}
    # a malformed class (1 or 3 bytes) is refused and changes nothing
    before = run.svm.data(run.address)
    for payload in (b"\1", b"\1\2\3"):
        with pytest.raises(TransactionFailed) as refused:
            run.svm.send([_join_instruction(harness, 0, payload)], [harness.clients[0]])
        assert refused.value.code is not None
        assert error_name(refused.value.code) == "InvalidInstruction"
    assert run.svm.data(run.address) == before
    # a re-join (another machine) replaces the class
    harness.classes[1] = 0x0701
    assert harness.apply(("join", 1)) is None
    assert run.account().pending_replay_classes()[harness.node(1)] == 0x0701

    run.svm.advance(2)
    assert harness.apply(("tick",)) is None  # warm-up: the Python state agrees (apply)
    chain = harness.chain()
    assert chain.run_state is RunState.Warmup
    assert {c.id: c.replay_class for c in chain.epoch_state.clients} == {
        harness.node(0): 0xBEEF, harness.node(1): 0x0701, harness.node(2): 0,
        harness.node(3): 3, harness.node(4): 0}
    # the registry entry keeps its class: the next epoch's join gives it again
    assert decode_coordinator(run.svm.data(run.address)).replay_classes[keys[0]] == 0xBEEF


def _check_every_report(harness: ClassHarness) -> int:
    """Every listed Healthy client reports every member (itself included), each report on
    the state as it is now (restored after an accepted one): accepted iff the plan says
    it follows and it has not reported that trainer yet. Returns how many were accepted."""
    address = harness.run.address
    saved_account = harness.svm.svm.get_account(address)
    assert saved_account is not None
    saved_state = copy.deepcopy(harness.state)
    plan = harness.plan()
    members = epoch_members(harness.state.epoch_state)
    by_node = {harness.node(i): i for i in range(len(harness.clients))}
    reporters = [c.id for c in harness.state.epoch_state.clients if c.state is ClientState.Healthy]
    reported = {(r.reporter, r.accused) for r in harness.state.epoch_state.reports}
    accepted = 0
    for reporter in reporters:
        for accused in members:
            result = harness.apply(harness.report(by_node[reporter], accused))
            expected = plan.follows(reporter, accused) and (reporter, accused) not in reported
            assert (result is None) == expected, (reporter, accused, result)
            if result is None:
                accepted += 1
                harness.svm.svm.set_account(address, saved_account)
                harness.python = Coordinator(copy.deepcopy(saved_state))
            else:
                assert result == "InvalidVerificationReport"
    return accepted


def _check_plan_is_grouped(harness: ClassHarness) -> None:
    """The spec's shape: a watched trainer of class c != 0 whose class has g members gets
    min(F, g - 1) followers of its class; with every class 0, the classless plan."""
    epoch = harness.state.epoch_state
    members = epoch_members(epoch)
    classes = {c.id: c.replay_class for c in (*epoch.clients, *epoch.exited_clients)}
    plan = harness.plan()
    m, percent = len(members), harness.state.config.verification_percent
    assert len(plan.followers) == min(m, math.ceil(m * percent / 100))
    per_trainer = min(FOLLOWERS_PER_TRAINER, m - 1)
    for trainer, followers in plan.followers.items():
        c = classes[trainer]
        same = [f for f in followers if c != 0 and classes[f] == c]
        g = sum(1 for member in members if classes[member] == c)
        assert len(same) == (min(per_trainer, g - 1) if c != 0 else 0), (trainer, followers)
        assert trainer not in followers and 1 <= len(followers) <= per_trainer
    if not any(classes.values()):
        assert plan == follow_plan(members, epoch.verification_seed, percent)


# client i joins with MIX[i]; the second value is verification_percent. With verification
# on, a warm-up lists a client of a nonzero class only when min(3, n) joiners share it
# (coordinator.verification.eligible_joiners): the last two mixes have classes that few.
MIXES = {
    "every-class-0": ([0] * 8, PERCENT),
    "classes-of-4-3-and-0": ([1, 1, 1, 1, 0xBEEF, 0xBEEF, 0xBEEF, 0], PERCENT),
    "one-class-for-all": ([0x0500] * 8, PERCENT),
    "classes-of-3-3-and-0-watched-half": ([2, 2, 2, 0x0300, 0x0300, 0x0300, 0, 0], 50),
    "classes-of-3-3-and-0-three-quarters": ([9, 4, 9, 0, 4, 9, 4, 0], 75),
    "two-clients-of-one-class": ([6, 6], PERCENT),
    # classes that differ in their high byte only, interleaved (the program sorts by class)
    "classes-sharing-a-low-byte": ([0x0100, 0, 0x0200, 0x0100, 0, 0x0200, 0x0100, 0x0200],
                                   PERCENT),
    # classes too small to be eligible: their clients stay pending, unlisted
    "classes-of-4-2-1-and-0": ([1, 1, 1, 1, 0xBEEF, 0xBEEF, 7, 0], PERCENT),
    "pairs-and-singles": ([9, 9, 4, 4, 6, 0, 8, 0], 75),
}


@pytest.mark.parametrize("offset", [0, 17, 41])
@pytest.mark.parametrize("mix", list(MIXES))
def test_the_program_accepts_reports_exactly_from_the_grouped_plans_followers(mix: str,
                                                                             offset: int):
    classes, percent = MIXES[mix]
    clients = _keys(170 + offset, len(classes))
    harness = ClassHarness(clients, dict(enumerate(classes)), percent)
    harness.svm.advance(offset, slots=offset + 1)  # another round-0 seed
    harness.start_epoch(list(range(len(classes))))
    _trained(harness)
    chain = harness.chain().epoch_state
    need = min(FOLLOWERS_PER_TRAINER + 1, len(classes))
    assert {c.id: c.replay_class for c in chain.clients} == {
        harness.node(i): c for i, c in enumerate(classes) if c == 0 or classes.count(c) >= need}
    _check_plan_is_grouped(harness)
    accepted = _check_every_report(harness)
    assert accepted == sum(len(fs) for fs in harness.plan().followers.values())


def test_an_exited_member_keeps_its_class_and_its_place_in_the_plan():
    """A trainer ejected by its two followers leaves the client list at the round's end; it
    stays a member of the epoch with its class, and the plan (and the program) with it."""
    classes = [1, 1, 1, 0xBEEF, 0xBEEF, 0xBEEF, 0, 1]
    harness = ClassHarness(_keys(210, len(classes)), dict(enumerate(classes)), PERCENT)
    harness.start_epoch(list(range(len(classes))))
    _trained(harness)
    plan = harness.plan()
    healthy = {c.id for c in harness.state.epoch_state.clients if c.state is ClientState.Healthy}
    by_node = {harness.node(i): i for i in range(len(classes))}
    trainer = next(t for t in sorted(plan.followers, key=lambda t: classes[by_node[t]] != 1)
                   if set(plan.followers[t]) <= healthy and len(plan.followers[t]) == 2)
    for follower in plan.followers[trainer]:
        assert harness.apply(harness.report(by_node[follower], trainer)) is None
    assert harness.client_state(trainer) is ClientState.Ejected
    harness.until(lambda s: any(c.id == trainer for c in s.epoch_state.exited_clients))
    exited = {c.id: c for c in harness.chain().epoch_state.exited_clients}
    assert exited[trainer].replay_class == classes[by_node[trainer]]
    assert harness.plan() == plan
    # the trainer reports no more (exited) and its followers have reported it already
    assert _check_every_report(harness) == sum(
        1 for t, fs in plan.followers.items() for f in fs if trainer not in (f, t))




def test_a_report_in_a_full_run_fits_the_default_compute_budget():
    """256 joiners of mixed classes: the warm-up tick (eligibility: a heap sort of the
    pending classes) and an accepted report (at most three elections of 90 rounds: pos(t),
    then pos_c of both or pos of the reporter, plus O(m) rank counting) stay under the 200k
    units a transaction without a compute-budget instruction gets per instruction. The
    pair and the single are not eligible: they stay pending, unlisted."""
    n = 256
    classes = [i % 5 for i in range(n - 3)] + [0x0B0B, 0x0B0B, 0x0C0C]  # a pair and a single
    state_file = small_run_state(n - 3, 1, 1, 10, total_steps=40)
    config = state_file.config.model_copy(update={"verification_percent": PERCENT})
    run = SvmRun.create(state_file.model_copy(update={"config": config}))
    run.authorize_permissionless()
    keys = _keys(0, n)
    for key, replay_class in zip(keys, classes, strict=True):
        run.svm.airdrop(key.pubkey(), 10**9)
        run.join(key, replay_class=replay_class)
    run.svm.advance(2)
    warmup_units = run.tick().compute_units
    assert warmup_units < ix.DEFAULT_INSTRUCTION_COMPUTE_UNITS, warmup_units
    account = run.account()
    assert account.pending == [key.pubkey() for key in keys[-3:]]
    by_node = {NodeIdentity(bytes(key.pubkey())): key for key in keys}
    run.play_until(keys, lambda state: state.run_state is RunState.RoundTrain
                   and state.progress.step > state.epoch_state.start_step, max_steps=20)
    state = run.account().state
    assert state is not None and state.run_state is RunState.RoundTrain
    epoch = state.epoch_state
    class_of = {c.id: c.replay_class for c in epoch.clients}
    assert sorted(class_of.values()) == sorted(classes[:-3])
    plan = plan_for_epoch(epoch, PERCENT)
    # one report per kind of trainer: class 0, a class of about 51
    kinds: dict[int, tuple[NodeIdentity, NodeIdentity] | None] = {0: None, 1: None}
    for trainer, followers in plan.followers.items():
        if class_of[trainer] in kinds and kinds[class_of[trainer]] is None:
            kinds[class_of[trainer]] = (trainer, followers[0])
    units = {}
    for replay_class, pair in kinds.items():
        assert pair is not None
        trainer, follower = pair
        report = VerificationReport(follower, trainer, state.progress.step - 1, bytes(32),
                                    bytes([1]) * 32, 1, 2, 3)
        units[replay_class] = run.verification_report(by_node[follower], report).compute_units
    assert max(units.values()) < ix.DEFAULT_INSTRUCTION_COMPUTE_UNITS, units
    assert units[1] > units[0], units  # the same-class path costs one election more


def test_a_full_registry_of_distinct_classes_stays_pending_within_the_compute_budget():
    """The eligibility's worst case: 256 joiners, every class different (none shared by
    three), verification on. The tick's heap sort stays under the default 200k units and
    lists nobody: the run keeps waiting for members."""
    n = 256
    state_file = small_run_state(2, 1, 1, 10, total_steps=40)
    config = state_file.config.model_copy(update={"verification_percent": PERCENT})
    run = SvmRun.create(state_file.model_copy(update={"config": config}))
    run.authorize_permissionless()
    keys = _keys(0, n)
    for i, key in enumerate(keys):
        run.svm.airdrop(key.pubkey(), 10**9)
        run.join(key, replay_class=0xFFFF - 3 * i)
    run.svm.advance(2)
    units = run.tick().compute_units
    account = run.account()
    assert account.run_state is RunState.WaitingForMembers
    assert len(account.pending) == n
    assert units < ix.DEFAULT_INSTRUCTION_COMPUTE_UNITS, units


def test_a_joiner_whose_class_too_few_share_stays_pending_for_a_later_epoch():
    """Verification on, six joiners: class 1 three times, class 7 twice, class 0. need = 3:
    the class-7 pair is not listed and its registry entries stay pending into the next
    epoch; when a third client of class 7 joins it, that warm-up lists all three. Python
    (eligible_joiners) and the program agree after every event (registry included)."""
    clients = _keys(230, 7)
    harness = ClassHarness(clients, {0: 1, 1: 1, 2: 1, 3: 7, 4: 7, 5: 0, 6: 7}, PERCENT)
    harness.start_epoch([0, 1, 2, 3, 4, 5])
    assert {c.id for c in harness.chain().epoch_state.clients} == {
        harness.node(i) for i in (0, 1, 2, 5)}
    assert harness.run.account().pending == [clients[3].pubkey(), clients[4].pubkey()]
    harness.until(lambda s: s.run_state is RunState.WaitingForMembers)
    assert harness.run.account().pending == [clients[3].pubkey(), clients[4].pubkey()]
    for i in (0, 1, 2, 5, 6):
        assert harness.apply(("join", i)) is None
    harness.svm.advance(2)
    assert harness.apply(("tick",)) is None
    assert harness.state.run_state is RunState.Warmup
    assert {c.id for c in harness.chain().epoch_state.clients} == {
        harness.node(i) for i in range(7)}
    assert harness.run.account().pending == []


def test_the_backend_predicts_a_warmup_only_when_enough_joiners_are_eligible():
    """The client's Solana backend simulates the tick to know whether one is due: with the
    joiners' classes, as the program decides. Three joiners of three classes: no warm-up
    (a due tick would be sent in vain again and again); the same three of one class: due."""
    state_file = small_run_state(2, 1, 1, 10, total_steps=40)
    config = state_file.config.model_copy(update={"verification_percent": PERCENT})
    run = SvmRun.create(state_file.model_copy(update={"config": config}))
    run.authorize_permissionless()
    keys = _keys(240, 3)
    for i, key in enumerate(keys):
        run.svm.airdrop(key.pubkey(), 10**9)
        run.join(key, replay_class=i + 1)
    run.svm.advance(5)
    backend = SolanaBackend(SolanaBackendOptions(rpc=["http://127.0.0.1:9"], wallet=keys[0],
                                                 run_id="x", p2p_address="x"))
    try:
        assert backend.tick_would_change(run.account(), run.svm.now) is False
        run.tick()
        assert run.account().run_state is RunState.WaitingForMembers  # the program agrees
        for key in keys:
            run.join(key, replay_class=0x0D0D)
        run.svm.advance(1)
        assert backend.tick_would_change(run.account(), run.svm.now) is True
        run.tick()
        assert run.account().run_state is RunState.Warmup
    finally:
        asyncio.run(backend.rpc.close())
