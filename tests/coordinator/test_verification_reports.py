"""Followers and verification reports in the pure coordinator (coordinator/verification.py)."""

from __future__ import annotations

import struct

import pytest
from coordinator_sim import state_file
from verification_round import key, report
from verification_round import running as running_round

from coordinator import (
    ClientState,
    Coordinator,
    CoordinatorError,
    StateDecodeError,
    decode_state,
    encode_state,
)
from coordinator.state import EpochState, VerificationReport
from coordinator.verification import (
    MAX_REPORTS,
    FollowPlan,
    epoch_members,
    follow_plan,
    plan_for_epoch,
)


@pytest.mark.parametrize("m", [2, 3, 4, 7, 16, 100])
@pytest.mark.parametrize("percent", [1, 10, 50, 99])
def test_the_plan_follows_ceil_m_percent_trainers_each_by_distinct_other_clients(
        m: int, percent: int) -> None:
    members = sorted(key(i) for i in range(m))
    plan = follow_plan(members, seed=12345, verification_percent=percent)
    assert len(plan.followers) == -(-m * percent // 100)
    for trainer, followers in plan.followers.items():
        assert len(followers) == min(2, m - 1)
        assert trainer not in followers and len(set(followers)) == len(followers)
        assert set(followers) <= set(members)
    # same inputs, same plan; another seed, (almost always) another plan
    assert follow_plan(members, 12345, percent) == plan
    if m >= 7:
        assert follow_plan(members, 54321, percent) != plan


def test_no_plan_without_verification_or_with_one_client() -> None:
    assert follow_plan([key(i) for i in range(5)], 1, 0) == FollowPlan({})
    assert follow_plan([key(0)], 1, 50) == FollowPlan({})


def test_every_client_is_watched_about_as_often_over_seeds() -> None:
    members = sorted(key(i) for i in range(10))
    counts = dict.fromkeys(members, 0)
    for seed in range(400):
        for trainer in follow_plan(members, seed, 30).followers:
            counts[trainer] += 1
    assert sum(counts.values()) == 400 * 3
    assert min(counts.values()) > 60 and max(counts.values()) < 180  # mean 120


def test_members_include_exited_clients_and_ignore_order() -> None:
    from coordinator.state import Client
    a = EpochState(clients=[Client(key(2)), Client(key(1))], exited_clients=[Client(key(3))])
    b = EpochState(clients=[Client(key(3)), Client(key(1))], exited_clients=[Client(key(2))])
    assert epoch_members(a) == epoch_members(b) == sorted([key(1), key(2), key(3)])


# ------------------------------------------------------------------ reports on a running coordinator
def running(clients: int = 4, percent: int = 50) -> Coordinator:
    return running_round(state_file(verification_percent=percent, min_clients=3,
                                    init_min_clients=clients, witness_nodes=0), clients)


def test_two_followers_reports_eject_the_trainer_and_one_does_not() -> None:
    coordinator = running()
    state = coordinator.state
    assert state.epoch_state.verification_seed == 99
    plan = plan_for_epoch(state.epoch_state, 50)
    trainer, (first, second) = sorted(plan.followers.items())[0]
    step = state.epoch_state.start_step
    assert coordinator.verification_report(first, report(first, trainer, step)) is None
    index = state.index_of(trainer)
    assert index is not None and state.epoch_state.clients[index].state is ClientState.Healthy
    assert coordinator.verification_report(second, report(second, trainer, step + 1)) is None
    assert state.epoch_state.clients[index].state is ClientState.Ejected
    assert [r.reporter for r in state.epoch_state.reports] == [first, second]
    # the evidence survives the wire and a restart
    again = decode_state(encode_state(state))
    assert again.epoch_state.reports == state.epoch_state.reports
    assert again.epoch_state.verification_seed == 99


def test_each_bad_report_is_refused_and_changes_nothing() -> None:
    coordinator = running()
    state = coordinator.state
    plan = plan_for_epoch(state.epoch_state, 50)
    trainer, (first, _) = sorted(plan.followers.items())[0]
    outsider = next(n for n in epoch_members(state.epoch_state)
                    if n not in plan.followers[trainer] and n != trainer)
    step = state.epoch_state.start_step
    before = encode_state(state)
    cases = [
        (outsider, report(outsider, trainer, step), "does not follow"),
        (first, report(first, trainer, state.progress.step), "not a trained step"),
        (first, report(first, trainer, step - 1), "not a trained step"),
        (first, report(trainer, trainer, step), "the reporter must be the sender"),
        (key(99), report(key(99), trainer, step), ""),
        (first, VerificationReport(first, trainer, step, b"\x01" * 32, b"\x01" * 32, 0, 0, 0),
         "the same"),
    ]
    for sender, bad, detail in cases:
        rejected = coordinator.verification_report(sender, bad)
        assert rejected is not None and detail in str(rejected), (bad, rejected)
        assert rejected.error in (CoordinatorError.InvalidVerificationReport,
                                  CoordinatorError.NotAClient)
        assert encode_state(state) == before
    assert coordinator.verification_report(first, report(first, trainer, step)) is None
    duplicate = coordinator.verification_report(first, report(first, trainer, step + 1))
    assert duplicate is not None and "already reported" in str(duplicate)


def test_reports_are_bounded_and_cleared_at_the_next_warmup() -> None:
    coordinator = running(clients=40, percent=99)
    state = coordinator.state
    plan = plan_for_epoch(state.epoch_state, 99)
    accepted = 0
    for trainer, followers in sorted(plan.followers.items()):
        for follower in followers[:1]:  # one report each: nobody is ejected
            if coordinator.verification_report(
                    follower, report(follower, trainer, state.epoch_state.start_step)) is None:
                accepted += 1
    assert accepted == MAX_REPORTS == len(state.epoch_state.reports)
    coordinator.start_warmup(5_000, [key(i) for i in range(40)])
    assert state.epoch_state.reports == [] and state.epoch_state.verification_seed == 0


def test_a_version_1_state_still_decodes() -> None:
    state = running().state
    v2 = encode_state(state, version=2)
    tail = struct.calcsize("<QB")
    assert v2[-tail:] == struct.pack("<QB", 99, 0)
    v1 = v2[:4] + struct.pack("<H", 1) + v2[6:-tail]
    assert encode_state(state, version=1) == v1
    decoded = decode_state(v1)
    assert decoded.epoch_state.verification_seed == 0 and decoded.epoch_state.reports == []
    assert decoded.progress == state.progress


def test_a_version_2_state_still_decodes_with_no_holders() -> None:
    """Version 3 added a client's holds_model byte; a version 2 state (a saved one of an
    older server) decodes with nobody holding the model, the rest unchanged."""
    state = running().state
    for client in state.epoch_state.clients:
        client.holds_model = True
    decoded = decode_state(encode_state(state, version=2))
    assert decoded.epoch_state.clients and not any(
        c.holds_model for c in decoded.epoch_state.clients)
    for client in state.epoch_state.clients:
        client.holds_model = False
    assert decoded == state
    assert decode_state(encode_state(state)) == state
    # A holds_model byte other than 0 or 1 is refused by name.
    data = bytearray(encode_state(state))
    at = data.index(state.epoch_state.clients[0].id.key) + 32 + 1 + 4
    data[at] = 2
    with pytest.raises(StateDecodeError, match="holds_model 2"):
        decode_state(bytes(data))
