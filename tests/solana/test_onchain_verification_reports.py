"""Verification reports on chain (coordinator/verification.py, programs/coordinator_machine.h):
the same reports through `coordinator.Coordinator` and through the program in LiteSVM give
the same decision (with the same error name) and the same decoded state, the follow plan
included; a client reported by a quorum of its followers is Ejected and, at the epoch's
end, earns nothing and is slashed; the client's Solana backend sends the report."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
from solders.instruction import Instruction
from solders.keypair import Keypair

from client_image.backends.solana import SolanaBackend, SolanaBackendOptions
from coordinator import ClientState, NodeIdentity, RunState
from coordinator.state import CoordinatorState, VerificationReport
from coordinator.verification import MAX_REPORTS, FollowPlan, plan_for_epoch
from psyche_solana import instructions as ix
from psyche_solana.svm import TransactionFailed
from tests.solana.test_differential import Harness, small_run_state

PERCENT = 100
SLASHING = 7
EARNING = 1000


class ReportHarness(Harness):
    """test_differential's harness over its own clients, plus ("report", i, report)."""

    def __init__(self, clients: list[Keypair], percent: int, min_clients: int = 2):
        state_file = small_run_state(2, min_clients, 1, 10, total_steps=40)
        config = state_file.config.model_copy(update={"verification_percent": percent})
        super().__init__(state_file.model_copy(update={"config": config}), random.Random(5),
                         clients)

    def _python(self, event: tuple, now: int, seed: int) -> Any:
        if event[0] == "report":
            _, node = self._client(event[1])
            return self.python.verification_report(node, event[2])
        return super()._python(event, now, seed)

    def _chain(self, event: tuple) -> None:
        if event[0] == "report":
            self.run.verification_report(self.clients[event[1]], event[2])
        else:
            super()._chain(event)

    # -------------------------------------------------------------- helpers
    @property
    def state(self) -> CoordinatorState:
        return self.python.state

    def chain(self) -> CoordinatorState:
        """The program's state, decoded."""
        state = self.run.account().state
        assert state is not None
        return state

    def client_state(self, node: NodeIdentity, state: CoordinatorState | None = None) -> ClientState:
        state = state or self.state
        index = state.index_of(node)
        assert index is not None
        return state.epoch_state.clients[index].state

    def index(self, node: NodeIdentity) -> int:
        return next(i for i in range(len(self.clients)) if self._client(i)[1] == node)

    def listed(self) -> list[int]:
        return [i for i in range(len(self.clients))
                if self.state.index_of(self._client(i)[1]) is not None]

    def plan(self) -> FollowPlan:
        return plan_for_epoch(self.state.epoch_state, self.state.config.verification_percent)

    def report(self, reporter: int, accused: int | NodeIdentity, step: int | None = None,
               same: bool = False) -> tuple:
        accused_id = accused if isinstance(accused, NodeIdentity) else self._client(accused)[1]
        published = bytes([reporter + 1]) * 32
        report = VerificationReport(
            self._client(reporter)[1], accused_id,
            self.state.progress.step - 1 if step is None else step, published,
            published if same else bytes([0xEE]) * 32, 250_000 + reporter, 2**32 - 1, 17)
        return ("report", reporter, report)

    def start_epoch(self, joining: list[int]) -> None:
        for i in joining:
            self.apply(("join", i))
        self.svm.advance(2)
        self.apply(("tick",))
        assert self.state.run_state is RunState.Warmup

    def play_round(self) -> None:
        """Witness the current round, then tick until the next phase change."""
        state = self.state
        if state.run_state is RunState.Warmup:
            self.apply(("warmup_witness", self.listed()[0], True))
            return
        if state.run_state is RunState.RoundTrain:
            for i in self.listed():
                self.apply(("witness", i, True))
        self.svm.advance(3)
        self.apply(("tick",))

    def until(self, done: Callable[[CoordinatorState], bool], rounds: int = 60) -> None:
        for _ in range(rounds):
            if done(self.state):
                return
            self.play_round()
        raise AssertionError(f"not reached: {self.state.run_state.name} "
                             f"step {self.state.progress.step}")


def _trained(harness: ReportHarness) -> None:
    """Round 1 of the epoch under way: step start_step is a trained step."""
    harness.until(lambda s: s.run_state is RunState.RoundTrain
                  and s.progress.step > s.epoch_state.start_step)


def test_reports_and_their_refusals_are_identical_on_chain():
    clients = [Keypair.from_seed(bytes([40 + i]) * 32) for i in range(5)]
    harness = ReportHarness(clients, PERCENT)
    harness.apply(("rates", EARNING, SLASHING))
    harness.start_epoch([0, 1, 2, 3])  # 4 stays outside the epoch
    # not active: warm-up (and nothing elected yet)
    assert harness.apply(harness.report(0, 1, step=1)) == "WrongRunState"
    _trained(harness)
    state = harness.state
    seed = state.epoch_state.verification_seed
    assert seed == state.epoch_state.rounds[0].random_seed != 0
    assert harness.chain().epoch_state.verification_seed == seed

    plan = harness.plan()
    assert len(plan.followers) == 4  # 100 %: everyone is watched, by 2 followers
    accused_id, (first_id, second_id) = sorted(plan.followers.items())[0]
    accused, first, second = map(harness.index, (accused_id, first_id, second_id))
    stranger = next(i for i in harness.listed() if i not in (accused, first, second))
    start, now = state.epoch_state.start_step, state.progress.step

    assert harness.apply(harness.report(4, accused)) == "NotAClient"
    assert harness.apply(harness.report(stranger, accused)) == "InvalidVerificationReport"
    assert harness.apply(harness.report(first, first)) == "InvalidVerificationReport"
    assert harness.apply(harness.report(first, 4)) == "InvalidVerificationReport"  # not a member
    for bad_step in (start - 1, now, now + 5):
        assert harness.apply(harness.report(first, accused, bad_step)) == \
            "InvalidVerificationReport"
    assert harness.apply(harness.report(first, accused, same=True)) == \
        "InvalidVerificationReport"

    assert harness.apply(harness.report(first, accused, step=start)) is None
    assert harness.client_state(accused_id) is ClientState.Healthy  # one cannot eject
    assert harness.apply(harness.report(first, accused)) == "InvalidVerificationReport"  # dup
    assert harness.apply(harness.report(second, accused)) is None
    chain = harness.chain()
    assert len(chain.epoch_state.reports) == 2
    assert chain.epoch_state.reports[1].jaccard_ppm == 250_000 + second
    assert harness.client_state(accused_id, chain) is ClientState.Ejected
    # an ejected client reports nothing more
    watched = next(t for t, fs in plan.followers.items() if accused_id in fs)
    assert harness.apply(harness.report(accused, watched)) == "NotAClient"

    # the epoch ends: the ejected client earns nothing and is slashed, the others earn
    harness.until(lambda s: s.run_state is RunState.WaitingForMembers)
    rewards = {entry.id: entry for entry in harness.chain().rewards.entries}
    assert rewards[accused_id].earned == 0 and rewards[accused_id].slashed == SLASHING
    for other in (first_id, second_id):
        assert rewards[other].earned > 0 and rewards[other].slashed == 0
    # reports stay with their epoch (after its end: not active) and go at the next warm-up
    assert harness.apply(harness.report(first, accused)) == "WrongRunState"
    assert len(harness.state.epoch_state.reports) == 2
    harness.start_epoch([0, 1, 2, 3])
    epoch = harness.chain().epoch_state
    assert epoch.reports == [] and epoch.verification_seed == 0


def test_two_clients_record_evidence_but_never_eject():
    clients = [Keypair.from_seed(bytes([60 + i]) * 32) for i in range(2)]
    harness = ReportHarness(clients, 50, min_clients=1)
    harness.start_epoch([0, 1])
    _trained(harness)
    plan = harness.plan()
    assert len(plan.followers) == 1  # ceil(2 * 50 / 100)
    [(accused_id, (follower_id,))] = plan.followers.items()
    accused, follower = harness.index(accused_id), harness.index(follower_id)
    assert harness.apply(harness.report(accused, follower)) == "InvalidVerificationReport"
    assert harness.apply(harness.report(follower, accused)) is None
    assert all(c.state is ClientState.Healthy for c in harness.state.epoch_state.clients)


def test_verification_off_refuses_every_report():
    clients = [Keypair.from_seed(bytes([70 + i]) * 32) for i in range(3)]
    harness = ReportHarness(clients, 0)
    harness.start_epoch([0, 1, 2])
    _trained(harness)
    for reporter, accused in ((0, 1), (1, 2), (2, 0), (1, 0)):
        assert harness.apply(harness.report(reporter, accused)) == "InvalidVerificationReport"


def test_the_epoch_holds_at_most_max_reports():
    """20 members, everyone watched: each trainer's first follower reports (20), then the
    second followers in plan order (order[p]'s is order[p + 2], not yet ejected when it
    reports) until the epoch is full; the 33rd report is refused."""
    clients = [Keypair.from_seed(bytes([100 + i]) * 32) for i in range(20)]
    harness = ReportHarness(clients, PERCENT)
    harness.start_epoch(list(range(20)))
    _trained(harness)
    followers = harness.plan().followers
    ring = [min(followers)]  # the plan's order, from some trainer on
    while len(ring) < len(followers):
        ring.append(followers[ring[-1]][0])
    for trainer in ring:
        assert harness.apply(harness.report(harness.index(followers[trainer][0]), trainer)) is None
    extra = MAX_REPORTS - len(ring)
    for trainer in ring[:extra]:
        assert harness.apply(harness.report(harness.index(followers[trainer][1]), trainer)) is None
    full = harness.report(harness.index(followers[ring[extra]][1]), ring[extra])
    assert harness.apply(full) == "InvalidVerificationReport"
    epoch = harness.chain().epoch_state
    assert len(epoch.reports) == MAX_REPORTS
    assert sum(c.state is ClientState.Ejected for c in epoch.clients) == extra


def test_the_backend_sends_a_report_as_a_transaction():
    clients = [Keypair.from_seed(bytes([80 + i]) * 32) for i in range(3)]
    harness = ReportHarness(clients, PERCENT)
    harness.start_epoch([0, 1, 2])
    _trained(harness)
    accused_id, (follower_id, _) = sorted(harness.plan().followers.items())[0]
    follower = harness.index(follower_id)
    _, _, report = harness.report(follower, accused_id)
    backend = SolanaBackend(SolanaBackendOptions(rpc=["http://127.0.0.1:9"],
                                                 wallet=clients[follower], run_id="x",
                                                 p2p_address="x"))
    backend.address = harness.run.address
    sent: list[list[Instruction]] = []

    async def transact(instructions: list[Instruction]) -> bool:
        sent.append(instructions)
        return True

    backend._transact = transact  # type: ignore[method-assign]  # capture, do not send
    async def send() -> bool:
        try:
            return await backend.report_verification(report)
        finally:
            await backend.rpc.close()

    assert asyncio.run(send()) is True
    assert sent == [[ix.verification_report(harness.run.address, clients[follower].pubkey(),
                                            report)]]
    harness.svm.send(sent[0], [clients[follower]])
    assert harness.chain().epoch_state.reports == [report]
    with pytest.raises(TransactionFailed, match="InvalidVerificationReport"):
        harness.svm.send(sent[0], [clients[follower]])  # once per follower
    with pytest.raises(ValueError, match="reporter"):
        ix.verification_report(harness.run.address, clients[(follower + 1) % 3].pubkey(), report)
