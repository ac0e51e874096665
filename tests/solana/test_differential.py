"""The on-chain coordinator is the Python coordinator: random event sequences applied to
`coordinator.Coordinator` and to our program in LiteSVM give the same decoded state (and
the same accept/reject decision, with the same error name) after every event."""

from __future__ import annotations

import copy
import hashlib
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from solders.keypair import Keypair

from coordinator import (
    Bloom,
    Coordinator,
    NodeIdentity,
    Rejected,
    RunState,
    Witness,
    WitnessProof,
    load_state_file,
    participant_item,
    selection_for_round,
    set_future_rates,
)
from coordinator.checkpoint_reports import report_problem
from coordinator.config import (
    Checkpoint,
    CoordinatorConfig,
    DummyCheckpoint,
    GcsCheckpoint,
    HubCheckpoint,
    P2PCheckpoint,
)
from psyche_solana import instructions as ix
from psyche_solana.errors import error_name
from psyche_solana.scenario import SvmRun
from psyche_solana.svm import ProgramSvm, TransactionFailed

BASE = load_state_file("config/local-testnet/state.toml")
CLIENTS = [Keypair.from_seed(bytes([i + 1]) * 32) for i in range(5)]
RUN_REPO = "assets/tiny-llama"
assert BASE.model.checkpoint == HubCheckpoint(repo_id=RUN_REPO)
# The run's checkpoint (the authority's location) and what clients report: the run's own
# repository (a new revision) or a foreign one; the machine turns Hub into P2P and back.
RUN_CHECKPOINTS: list[Checkpoint] = [
    HubCheckpoint(repo_id=RUN_REPO), GcsCheckpoint(bucket="bucket", prefix="run/"),
    GcsCheckpoint(bucket="bucket"), DummyCheckpoint(repo_id=RUN_REPO)]
# A revision must be a commit id: a ref (a pull request's, a branch) or none is refused.
COMMIT = "0123456789abcdef" * 2 + "01234567"
REPORTS: list[HubCheckpoint | GcsCheckpoint] = [
    HubCheckpoint(repo_id=RUN_REPO, revision=COMMIT), HubCheckpoint(repo_id=RUN_REPO),
    HubCheckpoint(repo_id="someone/else", revision=COMMIT),
    GcsCheckpoint(bucket="bucket", prefix="run/"), GcsCheckpoint(bucket="bucket"),
    GcsCheckpoint(bucket="other", prefix="run/"),
    HubCheckpoint(repo_id=RUN_REPO, revision="refs/pr/1"),
    HubCheckpoint(repo_id=RUN_REPO, revision=COMMIT.upper()),
    HubCheckpoint(repo_id=RUN_REPO, revision=COMMIT[:39])]


def small_run_state(init_min: int, min_clients: int, witness_nodes: int, warmup_pow: int,
                    total_steps: int = 12, checkpoint: Checkpoint = RUN_CHECKPOINTS[0]):
    """The local testnet's state with short phases, these client counts and a batch-size
    ramp over 2**warmup_pow tokens (shared by the Solana tests that run a program)."""
    config = CoordinatorConfig.model_validate({
        **BASE.config.model_dump(), "warmup_time": 10, "cooldown_time": 5,
        "max_round_train_time": 8, "round_witness_time": 2, "epoch_time": 40,
        "init_min_clients": init_min, "min_clients": min_clients,
        "witness_nodes": min(witness_nodes, min_clients), "total_steps": total_steps,
        "global_batch_size_start": 3, "global_batch_size_end": 9,
        # a power of two: f64 and exact rational batch sizes agree (see election.h)
        "global_batch_size_warmup_tokens": 2**warmup_pow,
        "waiting_for_members_extra_time": 1})
    model = BASE.model.model_copy(update={"checkpoint": checkpoint})
    return BASE.model_copy(update={"config": config, "model": model})


def _seed(unix_timestamp: int, slot: int) -> int:
    digest = hashlib.sha256(unix_timestamp.to_bytes(8, "little", signed=True)
                            + slot.to_bytes(8, "little")).digest()
    return int.from_bytes(digest[:8], "little")


def _random_bloom(rng: random.Random, items: list[bytes]) -> Bloom:
    bloom = Bloom(keys=tuple(rng.getrandbits(64) for _ in range(8)))
    for item in items:
        bloom.add(item)
    return bloom


class Harness:
    def __init__(self, state_file, rng: random.Random, clients: list[Keypair] = CLIENTS):
        self.clients = clients
        self.run = SvmRun.create(state_file, ProgramSvm())
        self.run.authorize_permissionless()
        for client in clients:
            self.run.svm.airdrop(client.pubkey(), 10**9)
        self.python = Coordinator(copy.deepcopy(self.run.account().state))
        self.registry: list[tuple[bytes, int]] = []
        self.next_active = 0
        self.rng = rng

    @property
    def svm(self) -> ProgramSvm:
        return self.run.svm

    def pending(self) -> list[NodeIdentity]:
        return [NodeIdentity(k) for k, active in self.registry if active == self.next_active]

    def apply(self, event: tuple) -> str | None:
        """Apply `event` on both sides, check they agree; the error's name, if refused."""
        kind = event[0]
        now, seed = self.svm.now, _seed(self.svm.now, self.svm.slot)
        python_state = self.python.state
        chain_error: str | None = None
        try:
            expected = self._python(event, now, seed)
            self._chain(event)
        except TransactionFailed as exc:
            assert exc.code is not None, exc
            chain_error = error_name(exc.code)
        python_error = expected.error.name if isinstance(expected, Rejected) else None
        assert chain_error == python_error, (event, chain_error, python_error)
        chain = self.run.account()
        assert chain.state == python_state, f"state differs after {event}"
        assert [(bytes(k), a) for k, a in chain.registry] == self.registry
        assert chain.next_active == self.next_active
        _ = kind
        return chain_error

    def _client(self, i: int) -> tuple[Keypair, NodeIdentity]:
        return self.clients[i], NodeIdentity(bytes(self.clients[i].pubkey()))

    def _witness(self, i: int, honest: bool, warmup: bool) -> tuple[Witness, NodeIdentity]:
        _, node = self._client(i)
        state = self.python.state
        index = state.index_of(node)
        index = index if index is not None else self.rng.randrange(6)
        if warmup:
            proof = WitnessProof(index, index, False)
        else:
            try:
                proof = selection_for_round(state).witness_of(index)
            except (ValueError, IndexError):
                proof = WitnessProof(0, index, True)
            if not honest:
                proof = WitnessProof(proof.position + 1, proof.index, True)
        seen = [participant_item(c.id.key) for c in state.epoch_state.clients
                if self.rng.random() < 0.7]
        return Witness(proof, _random_bloom(self.rng, seen), _random_bloom(self.rng, []),
                       self.rng.randbytes(32)), node

    def _python(self, event: tuple, now: int, seed: int):
        kind, py = event[0], self.python
        if kind == "tick":
            before = py.state.run_state
            result = py.tick(self.pending(), now, seed)
            if before is RunState.WaitingForMembers and py.state.run_state is RunState.Warmup:
                self.next_active += 1
            return result
        if kind == "join":
            key = bytes(self.clients[event[1]].pubkey())
            for n, (k, _) in enumerate(self.registry):
                if k == key:
                    self.registry[n] = (k, self.next_active)
                    break
            else:
                self.registry.append((key, self.next_active))
            return None
        if kind in ("witness", "warmup_witness"):
            self._pending_witness = self._witness(event[1], event[2], kind == "warmup_witness")
            witness, node = self._pending_witness
            if kind == "warmup_witness":
                return py.warmup_witness(node, witness, now, seed)
            return py.witness(node, witness, now)
        if kind == "health_check":
            _, sender = self._client(event[1])
            _, target = self._client(event[2])
            self._pending_check = self._health_proof(target)
            return py.health_check(sender, [(target, self._pending_check)])
        if kind == "checkpoint":
            _, node = self._client(event[1])
            index = py.state.index_of(node)
            self._pending_index = index if index is not None else 0
            self._pending_repo = REPORTS[event[2]]
            return py.checkpoint(node, self._pending_index, self._pending_repo)
        if kind == "pause":
            return py.pause(now)
        if kind == "resume":
            return py.resume(now)
        if kind == "accept_model_loss":
            return py.accept_model_loss()
        if kind == "rates":
            set_future_rates(py.state.rewards, event[1], event[2])
            return None
        raise AssertionError(kind)

    def _health_proof(self, target: NodeIdentity):
        from coordinator.committee import Committee, CommitteeProof

        state = self.python.state
        previous = state.previous_round
        index = state.index_of(target)
        index = index if index is not None else 0
        if previous is None or previous.clients_len == 0:
            return CommitteeProof(Committee.Trainer, 0, index)
        try:
            return selection_for_round(state, previous).committee_of(min(index, previous.clients_len - 1))
        except ValueError:
            return CommitteeProof(Committee.Trainer, 0, index)

    def _chain(self, event: tuple) -> None:
        kind, run = event[0], self.run
        if kind == "tick":
            run.tick()
        elif kind == "join":
            run.join(self.clients[event[1]])
        elif kind == "warmup_witness":
            run.warmup_witness(self.clients[event[1]], self._pending_witness[0])
        elif kind == "witness":
            run.witness(self.clients[event[1]], self._pending_witness[0])
        elif kind == "health_check":
            run.health_check(self.clients[event[1]], self._client(event[2])[1], self._pending_check)
        elif kind == "checkpoint":
            run.checkpoint(self.clients[event[1]], self._pending_index, self._pending_repo)
        elif kind == "pause":
            run.set_paused(True)
        elif kind == "resume":
            run.set_paused(False)
        elif kind == "accept_model_loss":
            run.accept_model_loss()
        elif kind == "rates":
            run.set_rates(event[1], event[2])


client = st.integers(0, len(CLIENTS) - 1)
EVENTS = st.one_of(
    st.tuples(st.just("advance"), st.sampled_from([0, 1, 2, 3, 5, 9, 11, 41])),
    st.tuples(st.just("tick")),
    st.tuples(st.just("join"), client),
    st.tuples(st.just("warmup_witness"), client, st.just(True)),
    st.tuples(st.just("witness"), client, st.booleans()),
    st.tuples(st.just("health_check"), client, client),
    st.tuples(st.just("checkpoint"), client, st.integers(0, len(REPORTS) - 1)),
    st.tuples(st.just("pause")),
    st.tuples(st.just("accept_model_loss")),
    st.tuples(st.just("rates"), st.none() | st.integers(0, 10**6), st.none() | st.integers(0, 99)),
)
# Runs that progress: mostly the natural next step of the current phase ("auto"),
# some of everything else (forged witnesses, wrong senders, pauses, stray ticks).
WEIGHTED = st.one_of(*[st.just(("auto",))] * 6, EVENTS)


def natural_events(harness: Harness, rng: random.Random) -> list[tuple]:
    """What a live run would do next in the current phase."""
    state = harness.python.state
    listed = [i for i, c in enumerate(CLIENTS)
              if state.index_of(NodeIdentity(bytes(c.pubkey()))) is not None]
    phase = state.run_state
    if phase is RunState.WaitingForMembers:
        if state.model_lost and rng.random() < 0.15:  # the authority gives up on the model
            return [("accept_model_loss",)]
        return [("join", rng.randrange(len(CLIENTS)))] if rng.random() < 0.4 else [
            ("advance", 2), ("tick",)]
    # Uploads end in Cooldown or, later, while the next epoch (P2P by then) is under way.
    uploaded = 0.3 if phase is RunState.Cooldown else 0.04 if phase.active else 0.0
    if listed and rng.random() < uploaded:
        # half of them name the run's own repository, as an honest uploader's would
        own = [i for i, r in enumerate(REPORTS) if report_problem(state.model.checkpoint, r) is None]
        pick = rng.choice(own) if own and rng.random() < 0.5 else rng.randrange(len(REPORTS))
        return [("checkpoint", rng.choice(listed), pick)]
    if phase is RunState.Warmup and listed and rng.random() < 0.6:
        return [("warmup_witness", rng.choice(listed), True)]
    if (phase is RunState.RoundTrain and len(listed) > 1 and state.current_round.height >= 2
            and rng.random() < 0.3):
        return [("health_check", rng.choice(listed), rng.choice(listed))]
    if phase is RunState.RoundTrain and listed and rng.random() < 0.7:
        selection = selection_for_round(state)
        witnesses = [i for i in listed if selection.witness_of(
            state.index_of(NodeIdentity(bytes(CLIENTS[i].pubkey())))).witness] or listed
        return [("witness", rng.choice(witnesses), True)]
    if phase is RunState.Paused:
        return [("resume",)]
    return [("advance", rng.choice([2, 3, 6, 9, 11])), ("tick",)]


# PSYCHE_DIFF_EXAMPLES=500 for a deeper local search (CI: a fixed, derandomized dozen).
@settings(max_examples=int(os.environ.get("PSYCHE_DIFF_EXAMPLES", "25")),
          derandomize="PSYCHE_DIFF_EXAMPLES" not in os.environ, deadline=None)
@given(init_min=st.integers(1, 3), min_clients=st.integers(1, 3),
       witness_nodes=st.integers(0, 2), warmup_pow=st.integers(0, 12),
       checkpoint=st.sampled_from(RUN_CHECKPOINTS),
       joins=st.lists(client, min_size=1, max_size=5),
       events=st.lists(WEIGHTED, min_size=10, max_size=150), rng_seed=st.integers(0, 2**32))
def test_random_event_sequences_give_the_same_state(init_min, min_clients, witness_nodes,
                                                   warmup_pow, checkpoint, joins, events,
                                                   rng_seed):
    min_clients = min(min_clients, init_min)
    harness = Harness(small_run_state(init_min, min_clients, witness_nodes, warmup_pow,
                                  checkpoint=checkpoint), random.Random(rng_seed))
    rng = random.Random(rng_seed + 1)
    for planned in [("rates", 1000, None)] + [("join", j) for j in joins] + events:
        for event in natural_events(harness, rng) if planned[0] == "auto" else [planned]:
            if event[0] == "advance":
                harness.svm.advance(event[1])
            else:
                harness.apply(event)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_natural_runs_with_noise_give_the_same_state(seed):
    """Hundreds of events of live-looking runs (several epochs, health checks, pauses)."""
    rng = random.Random(seed)
    harness = Harness(small_run_state(2, 2, seed % 3, 4 + seed, total_steps=80,
                                  checkpoint=RUN_CHECKPOINTS[seed - 1]), rng)
    phases = set()
    harness.apply(("rates", 999, 5))
    for _step in range(300):
        events = [random_event(rng)] if rng.random() < 0.08 else natural_events(harness, rng)
        for event in events:
            if event[0] == "advance":
                harness.svm.advance(event[1])
            else:
                harness.apply(event)
        phases.add(harness.python.state.run_state)
    assert {RunState.RoundTrain, RunState.RoundWitness, RunState.Cooldown} <= phases
    assert harness.python.state.progress.epoch >= 1


def random_event(rng: random.Random) -> tuple:
    c = rng.randrange(len(CLIENTS))
    return rng.choice([
        ("tick",), ("join", c), ("warmup_witness", c, True), ("witness", c, False),
        ("witness", c, True), ("health_check", c, rng.randrange(len(CLIENTS))),
        ("checkpoint", c, rng.randrange(len(REPORTS))), ("pause",), ("resume",),
        ("accept_model_loss",),
        ("rates", rng.randrange(10**6), None), ("advance", rng.choice([1, 5, 41]))])


def test_a_whole_epoch_is_identical_on_chain():
    """A scripted epoch: join, warm-up, rounds with witnesses, cooldown, points credited."""
    harness = Harness(small_run_state(2, 2, 1, 10, total_steps=40), random.Random(7))
    for event in [("rates", 1000, None), ("join", 0), ("join", 1)]:
        harness.apply(event)
    harness.svm.advance(2)
    harness.apply(("tick",))
    assert harness.python.state.run_state is RunState.Warmup
    harness.apply(("warmup_witness", 0, True))
    assert harness.python.state.run_state is RunState.RoundTrain
    for _ in range(40):
        state = harness.python.state
        if state.run_state is RunState.WaitingForMembers:
            break
        if state.run_state is RunState.RoundTrain:
            for i in (0, 1):
                harness.apply(("witness", i, True))
        harness.svm.advance(3)
        harness.apply(("tick",))
    account = harness.run.account()
    assert account.state.progress.epoch == 1
    assert account.earned(CLIENTS[0].pubkey()) == 500
    assert account.earned(CLIENTS[1].pubkey()) == 500
    # The next epoch, P2P from the same clients; their late upload reports a new revision.
    for event in [("join", 0), ("join", 1)]:
        harness.apply(event)
    harness.svm.advance(2)
    harness.apply(("tick",))
    assert harness.python.state.model.checkpoint == P2PCheckpoint(repo_id=RUN_REPO)
    assert harness.apply(("checkpoint", 1, 0)) is None
    assert harness.python.state.model.checkpoint == P2PCheckpoint(repo_id=RUN_REPO,
                                                                  revision=COMMIT)
    for foreign in (2, 3, 1, 6, 7, 8):  # another Hub repository; a GCS bucket; no commit id
        assert harness.apply(("checkpoint", 0, foreign)) == "CheckpointNotRunRepository"


def test_a_round_whose_witness_died_keeps_the_model_on_chain_too():
    """Round 0 witnessed, round 1 not: the epoch ends with its clients still Healthy
    (they hold the model), credited, and the next epoch stays P2P, on chain as in Python."""
    harness = Harness(small_run_state(2, 2, 1, 10, total_steps=40), random.Random(11))
    for event in [("rates", 1000, None), ("join", 0), ("join", 1)]:
        harness.apply(event)
    harness.svm.advance(2)
    harness.apply(("tick",))
    harness.apply(("warmup_witness", 0, True))
    for i in (0, 1):
        harness.apply(("witness", i, True))
    harness.svm.advance(3)
    harness.apply(("tick",))
    assert harness.python.state.current_round.height == 1
    for _ in range(4):  # RoundTrain and RoundWitness time out with nobody witnessing
        harness.svm.advance(11)
        harness.apply(("tick",))
        if harness.python.state.run_state is RunState.Cooldown:
            break
    state = harness.python.state
    assert state.run_state is RunState.Cooldown, state.run_state
    assert [c.state.name for c in state.epoch_state.clients] == ["Healthy", "Healthy"]
    for _ in range(3):
        harness.svm.advance(11)
        harness.apply(("tick",))
    assert harness.python.state.run_state is RunState.WaitingForMembers
    assert harness.run.account().earned(CLIENTS[0].pubkey()) == 500
    harness.apply(("join", 1))  # with a newcomer: client 1 holds the model
    harness.apply(("join", 2))
    harness.svm.advance(2)
    harness.apply(("tick",))
    assert harness.python.state.run_state is RunState.Warmup
    assert harness.python.state.model.checkpoint == P2PCheckpoint(repo_id=RUN_REPO)


def _epoch_that_trained(seed: int) -> Harness:
    """Clients 0 and 1 train an epoch of two witnessed rounds and end it: the run waits
    for members, its model (P2P) ahead of the stored checkpoint, on chain as in Python."""
    harness = Harness(small_run_state(2, 2, 1, 10, total_steps=40), random.Random(seed))
    for event in [("rates", 1000, None), ("join", 0), ("join", 1)]:
        harness.apply(event)
    harness.svm.advance(2)
    harness.apply(("tick",))
    harness.apply(("warmup_witness", 0, True))
    state = harness.python.state
    while state.run_state is not RunState.Cooldown:
        if state.run_state is RunState.RoundTrain and state.current_round.height < 2:
            for i in (0, 1):
                harness.apply(("witness", i, True))
        harness.svm.advance(11)
        harness.apply(("tick",))
    while state.run_state is RunState.Cooldown:
        harness.svm.advance(11)
        harness.apply(("tick",))
    assert state.run_state is RunState.WaitingForMembers and state.model_ahead
    assert state.model.checkpoint == P2PCheckpoint(repo_id=RUN_REPO)
    return harness


def test_a_lost_model_waits_for_a_holder_on_chain_too():
    harness = _epoch_that_trained(12)
    state = harness.python.state
    harness.apply(("join", 2))  # newcomers only: the model would be lost
    harness.apply(("join", 3))
    harness.svm.advance(2)
    harness.apply(("tick",))
    assert state.run_state is RunState.WaitingForMembers and state.model_lost
    assert harness.run.account().state.model_lost
    harness.apply(("join", 1))  # a holder is back: warm-up from it
    harness.apply(("tick",))
    assert state.run_state is RunState.Warmup and not state.model_lost
    assert state.model.checkpoint == P2PCheckpoint(repo_id=RUN_REPO)
    assert state.model_resets == 0


def test_the_authority_accepts_a_lost_model_on_chain_too():
    harness = _epoch_that_trained(13)
    state = harness.python.state
    harness.apply(("join", 2))
    harness.apply(("join", 3))
    harness.svm.advance(2)
    harness.apply(("tick",))
    assert state.model_lost
    assert harness.apply(("accept_model_loss",)) is None
    assert state.model.checkpoint == HubCheckpoint(repo_id=RUN_REPO) and state.model_resets == 1
    assert harness.apply(("accept_model_loss",)) == "WrongRunState"  # nothing left to lose
    harness.apply(("tick",))
    assert state.run_state is RunState.Warmup and harness.run.account().state.model_resets == 1


def test_only_the_authority_moves_the_checkpoint_repository():
    """A client's report may only advance the revision of the run's repository; the
    authority moves the repository with update-config on the paused run, on chain and in
    the Python machine alike, and reports follow it."""
    harness = Harness(small_run_state(1, 1, 1, 10), random.Random(3))
    for event in [("join", 0), ("join", 1)]:
        harness.apply(event)
    harness.svm.advance(2)
    harness.apply(("tick",))
    assert harness.python.state.run_state is RunState.Warmup
    foreign, own = REPORTS.index(HubCheckpoint(repo_id="someone/else", revision=COMMIT)), 0
    assert harness.apply(("checkpoint", 0, foreign)) == "CheckpointNotRunRepository"
    assert harness.apply(("checkpoint", 1, own)) is None
    assert harness.python.state.model.checkpoint == REPORTS[own]

    harness.apply(("pause",))  # Warmup: paused at once
    moved = harness.python.state.model.model_copy(update={
        "checkpoint": HubCheckpoint(repo_id="someone/else")})
    harness.run.admin(ix.update_model(harness.run.address, harness.run.authority.pubkey(), moved))
    harness.python.state.model = moved
    assert harness.run.account().state == harness.python.state
    harness.apply(("resume",))
    for event in [("join", 0), ("join", 1)]:
        harness.apply(event)
    harness.svm.advance(2)
    harness.apply(("tick",))
    assert harness.python.state.run_state is RunState.Warmup
    # "someone/else" is now the run's own repository
    assert harness.apply(("checkpoint", 0, foreign)) is None
    assert harness.python.state.model.checkpoint == REPORTS[foreign]
    assert harness.apply(("checkpoint", 1, own)) == "CheckpointNotRunRepository"


@pytest.mark.parametrize("tokens,expected", [(0, 3), (512, 6), (1023, 9), (1024, 9)])
def test_batch_size_ramp_matches(tokens, expected):
    config = small_run_state(1, 1, 0, 10).config
    assert config.batch_size(tokens) == expected
