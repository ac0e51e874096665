"""Who a verified epoch may list (issue 36, coordinator/verification.py `eligible_joiners`):
with verification on, a joiner of nonzero replay class is listed only when at least
min(FOLLOWERS_PER_TRAINER + 1, n) of the n pending joiners share its class, so every
listed trainer has followers of its own class; class 0 always; verification off changes
nothing. Through the pure function, the coordinator's tick and the waiting line."""

from __future__ import annotations

import random

import pytest
from coordinator_sim import state_file
from verification_round import key

from coordinator import Coordinator, RunState
from coordinator.state import NodeIdentity
from coordinator.verification import (
    FOLLOWERS_PER_TRAINER,
    class_shortfalls,
    eligible_joiners,
    plan_for_epoch,
)
from coordinator_tcp.summary import summarize
from psyche_common.ui.view import describe_wait

H100, H200, RARE = 0x51A3, 0x0C07, 0x7777


def joiners(*classes: int) -> tuple[list[NodeIdentity], dict[NodeIdentity, int]]:
    nodes = [key(i) for i in range(len(classes))]
    return nodes, dict(zip(nodes, classes, strict=True))


def test_a_unique_class_waits_while_three_of_a_class_are_eligible() -> None:
    pending, classes = joiners(H100, H100, RARE, H100)
    assert FOLLOWERS_PER_TRAINER + 1 == 3
    assert eligible_joiners(pending, classes, 50) == [pending[0], pending[1], pending[3]]
    assert class_shortfalls(pending, classes, 50) == {pending[2]: 2}
    # two of a class among four are short by one each: need = min(3, 4)
    pending, classes = joiners(H100, H100, H200, H200)
    assert eligible_joiners(pending, classes, 50) == []
    assert class_shortfalls(pending, classes, 50) == dict.fromkeys(pending, 1)


def test_two_clients_of_one_class_are_eligible_when_they_are_all_there_is() -> None:
    pending, classes = joiners(H100, H100)  # n = 2: need = 2
    assert eligible_joiners(pending, classes, 50) == pending
    pending, classes = joiners(H100, H200)
    assert eligible_joiners(pending, classes, 50) == []
    assert class_shortfalls(pending, classes, 50) == dict.fromkeys(pending, 1)
    pending, classes = joiners(RARE)  # n = 1: need = 1
    assert eligible_joiners(pending, classes, 50) == pending


def test_class_0_is_always_eligible() -> None:
    pending, classes = joiners(0, H100, H200, 0, RARE)
    assert eligible_joiners(pending, classes, 50) == [pending[0], pending[3]]
    # a joiner absent from the classes is class 0
    assert eligible_joiners(pending, {}, 50) == pending
    assert eligible_joiners(pending, {pending[1]: H100}, 50) == [
        node for node in pending if node != pending[1]]


def test_verification_off_changes_nothing() -> None:
    pending, classes = joiners(H100, H200, RARE)
    assert eligible_joiners(pending, classes, 0) == pending
    assert class_shortfalls(pending, classes, 0) == {}


def test_the_rule_is_deterministic_and_keeps_the_pending_order() -> None:
    rng = random.Random(36)
    for _ in range(200):
        n = rng.randint(1, 12)
        pending = [key(i) for i in rng.sample(range(40), n)]
        classes = {node: rng.choice((0, H100, H200, RARE)) for node in pending}
        eligible = eligible_joiners(pending, classes, rng.randint(1, 99))
        reordered = dict(reversed(list(classes.items())))  # the mapping's order is no input
        assert eligible == eligible_joiners(pending, reordered, 50)
        need = min(3, n)
        assert eligible == [node for node in pending if classes[node] == 0 or sum(
            classes[other] == classes[node] for other in pending) >= need]
        # every eligible joiner of a nonzero class has need - 1 others of its class
        for node in eligible:
            if classes[node]:
                assert sum(classes[x] == classes[node] for x in eligible) >= need


def test_duplicate_joiners_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="distinct") as error:
        eligible_joiners([key(1), key(1)], {}, 50)
    assert "\n" not in str(error.value)


def waiting(pending: list[NodeIdentity], classes: dict[NodeIdentity, int], *,
            verification_percent: int = 50, init_min_clients: int = 3,
            ticks: int = 50) -> Coordinator:
    coordinator = Coordinator.from_state_file(state_file(
        verification_percent=verification_percent, min_clients=1,
        init_min_clients=init_min_clients, witness_nodes=0))
    for now in range(1_000, 1_000 + 50 * ticks, 50):
        coordinator.tick(pending, now, 99, classes)
        if coordinator.state.run_state is not RunState.WaitingForMembers:
            break
    return coordinator


def test_a_warmup_lists_only_the_eligible_in_pending_order() -> None:
    pending, classes = joiners(H100, RARE, H100, H100)
    state = waiting(pending, classes).state
    assert state.run_state is RunState.Warmup
    assert [c.id for c in state.epoch_state.clients] == [pending[0], pending[2], pending[3]]
    assert all(c.replay_class == H100 for c in state.epoch_state.clients)
    # verification off: everyone, classes kept
    state = waiting(pending, classes, verification_percent=0).state
    assert [(c.id, c.replay_class) for c in state.epoch_state.clients] == [
        (node, classes[node]) for node in pending]


def test_init_min_clients_counts_only_the_eligible() -> None:
    pending, classes = joiners(H100, H100, H100, RARE)
    coordinator = waiting(pending, classes, init_min_clients=4)
    assert coordinator.state.run_state is RunState.WaitingForMembers
    assert coordinator.state.epoch_state.clients == []
    # two more of RARE's class join: all six are eligible, and listed in pending order
    more, more_classes = [key(10), key(11)], {key(10): RARE, key(11): RARE}
    everyone = [*pending, *more]
    coordinator = waiting(everyone, classes | more_classes, init_min_clients=4)
    assert [c.id for c in coordinator.state.epoch_state.clients] == everyone
    # and each listed trainer's followers, once the round starts, are of its own class
    coordinator.state.epoch_state.verification_seed = 5
    plan = plan_for_epoch(coordinator.state.epoch_state, 99)
    all_classes = classes | more_classes
    assert plan.followers and all(
        all(all_classes[y] == all_classes[t] for y in followers) and len(followers) == 2
        for t, followers in plan.followers.items())


def after_an_epoch_of_three_h100s(verification_percent: int) -> Coordinator:
    """Three H100s trained an epoch; the model is now ahead of the stored checkpoint and
    held only by the three."""
    pending, classes = joiners(H100, H100, H100)
    coordinator = waiting(pending, classes, verification_percent=verification_percent)
    assert [c.id for c in coordinator.state.epoch_state.clients] == pending
    coordinator.end_cooldown(5_000)
    coordinator.state.model_ahead = True
    assert coordinator.state.run_state is RunState.WaitingForMembers
    return coordinator


def tick_until_warmup(coordinator: Coordinator, pending: list[NodeIdentity],
                      classes: dict[NodeIdentity, int]) -> None:
    for now in range(6_000, 9_000, 50):
        coordinator.tick(pending, now, 99, classes)
        if coordinator.state.run_state is not RunState.WaitingForMembers:
            return


def test_an_ineligible_holder_is_not_the_holder_a_warmup_may_start_from() -> None:
    holder = key(0)
    newcomers = [key(20), key(21), key(22)]
    back = [holder, *newcomers]  # one H100 holder, three H200s: n = 4, need 3
    classes = {holder: H100} | dict.fromkeys(newcomers, H200)
    coordinator = after_an_epoch_of_three_h100s(50)
    tick_until_warmup(coordinator, back, classes)
    state = coordinator.state
    # the holder cannot be listed, and the three eligible hold nothing: the model is lost
    assert state.run_state is RunState.WaitingForMembers and state.model_lost
    # with verification off the holder counts, and the epoch starts from it
    coordinator = after_an_epoch_of_three_h100s(0)
    tick_until_warmup(coordinator, back, classes)
    assert coordinator.state.run_state is RunState.Warmup
    assert not coordinator.state.model_lost
    assert [c.id for c in coordinator.state.epoch_state.clients] == back


def test_the_waiting_line_says_who_waits_for_their_class() -> None:
    assert describe_wait("WaitingForMembers", init_min_clients=3, joined=4,
                         class_shortfalls=[2]) == (
        "waiting for 3 clients, 4 connected: starting; 1 waiting for 2 more clients of its "
        "replay class")
    assert describe_wait("WaitingForMembers", init_min_clients=3, joined=4,
                         class_shortfalls=[1, 1, 2]) == (
        "waiting for 3 clients, 4 connected; 1 waiting for 2 more clients of its replay "
        "class; 2 waiting for 1 more client of their replay class")
    assert describe_wait("WaitingForMembers", init_min_clients=3, joined=2) == (
        "waiting for 3 clients, 2 connected")
    pending, classes = joiners(H100, H100, H100, RARE)
    coordinator = waiting(pending, classes, init_min_clients=4)
    summary = summarize(coordinator.state, 1_000, pending=pending, replay_classes=classes)
    assert summary.joined == 4 and summary.class_shortfalls == (2,)
    assert summary.waiting == ("waiting for 4 clients, 4 connected; 1 waiting for 2 more "
                               "clients of its replay class")
    off = waiting(pending, classes, init_min_clients=5, verification_percent=0)
    assert summarize(off.state, 1_000, pending=pending, replay_classes=classes).waiting == (
        "waiting for 5 clients, 4 connected")
