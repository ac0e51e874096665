"""Replay classes in the pure coordinator (issue 36): the follow plan grouped by class
(coordinator/verification.py), the class kept by a warm-up and on the wire."""

from __future__ import annotations

import struct

import pytest
from coordinator_sim import state_file
from verification_round import key

from coordinator import (
    Coordinator,
    CoordinatorError,
    Rejected,
    RunState,
    StateDecodeError,
    decode_state,
)
from coordinator import encode_state as encode
from coordinator.committee import election_table
from coordinator.state import Client, EpochState, NodeIdentity
from coordinator.verification import (
    VERIFY_SALT,
    class_salt,
    epoch_members,
    follow_plan,
    plan_for_epoch,
)

SEEDS = range(40)


def members_of(n: int) -> list[NodeIdentity]:
    return sorted(key(i) for i in range(n))


def global_order(members: list[NodeIdentity], seed: int) -> list[NodeIdentity]:
    table = election_table(seed, len(members), VERIFY_SALT)
    return [member for _, member in sorted(zip(table, members, strict=True))]


def global_distance(members: list[NodeIdentity], seed: int, a: NodeIdentity,
                    b: NodeIdentity) -> int:
    """(pos(b) - pos(a)) mod m, from the spec's formula rather than the plan's code."""
    table = election_table(seed, len(members), VERIFY_SALT)
    return (table[members.index(b)] - table[members.index(a)]) % len(members)


def class_distance(group: list[NodeIdentity], replay_class: int, seed: int, a: NodeIdentity,
                   b: NodeIdentity) -> int:
    table = election_table(seed, len(group), class_salt(replay_class))
    return (table[group.index(b)] - table[group.index(a)]) % len(group)


def follows_by_spec(members: list[NodeIdentity], classes: dict[NodeIdentity, int], seed: int,
                    follower: NodeIdentity, trainer: NodeIdentity) -> bool:
    """The predicate the on-chain program evaluates (spec item 3), written out apart."""
    m, replay_class = len(members), classes.get(trainer, 0)
    f = min(2, m - 1)
    group = sorted(x for x in members if classes.get(x, 0) == replay_class) if replay_class else []
    f_c = min(f, len(group) - 1) if replay_class else 0
    same = (replay_class != 0 and classes.get(follower, 0) == replay_class
            and 1 <= class_distance(group, replay_class, seed, trainer, follower) <= f_c)
    return same or 1 <= global_distance(members, seed, trainer, follower) <= f - f_c


@pytest.mark.parametrize("m", [2, 3, 7, 16])
@pytest.mark.parametrize("percent", [10, 50, 100])
def test_with_every_class_0_the_plan_is_the_classless_one(m: int, percent: int) -> None:
    members = members_of(m)
    for seed in range(5):
        plain = follow_plan(members, seed, percent)
        assert follow_plan(members, seed, percent, dict.fromkeys(members, 0)) == plain
        assert follow_plan(members, seed, percent, {}) == plain
        order = global_order(members, seed)
        f = min(2, m - 1)
        for p, trainer in enumerate(order[:len(plain.followers)]):
            assert plain.followers[trainer] == tuple(order[(p + k) % m] for k in range(1, f + 1))


def test_a_class_of_three_or_more_follows_its_own_members() -> None:
    members = members_of(12)
    big, other = 0x1234, 0x0777
    classes = {x: (big if i < 6 else other) for i, x in enumerate(members)}
    for seed in SEEDS:
        plan = follow_plan(members, seed, 100, classes)
        assert len(plan.followers) == 12
        for trainer, followers in plan.followers.items():
            assert len(followers) == 2 and trainer not in followers
            assert {classes[y] for y in followers} == {classes[trainer]}
            for y in members:
                assert plan.follows(y, trainer) == follows_by_spec(members, classes, seed, y,
                                                                   trainer)


def test_a_class_of_two_gets_one_same_class_and_one_global_follower() -> None:
    members = members_of(10)
    pair = members[3], members[7]
    classes = dict.fromkeys(pair, 42)
    seen_other_class = False
    for seed in SEEDS:
        plan = follow_plan(members, seed, 100, classes)
        for trainer, partner in (pair, pair[::-1]):
            followers = plan.followers[trainer]
            assert followers[0] == partner  # F_c = 1: the only other member of its class
            order = global_order(members, seed)
            nearest = order[(order.index(trainer) + 1) % len(members)]
            # F - F_c = 1 global follower: the next in the global order, once
            assert followers == ((partner,) if nearest == partner else (partner, nearest))
            seen_other_class |= nearest != partner
    assert seen_other_class


def test_a_class_alone_and_class_0_get_global_followers() -> None:
    members = members_of(9)
    classes = {members[0]: 7, members[1]: 8, members[2]: 8, members[3]: 8}
    for seed in SEEDS:
        plan = follow_plan(members, seed, 100, classes)
        order = global_order(members, seed)
        for trainer in (members[0], members[5]):  # alone in class 7; class 0
            p = order.index(trainer)
            assert plan.followers[trainer] == (order[(p + 1) % 9], order[(p + 2) % 9])


@pytest.mark.parametrize("m", [2, 3, 5, 11, 40])
def test_the_grouped_plan_is_deterministic_and_matches_the_spec(m: int) -> None:
    members = members_of(m)
    classes = {x: 1 + (i * 7919) % 3 if i % 4 else 0 for i, x in enumerate(members)}
    for seed in range(10):
        plan = follow_plan(members, seed, 50, classes)
        assert follow_plan(list(members), seed, 50, dict(classes)) == plan
        assert len(plan.followers) == -(-m * 50 // 100)
        for trainer, followers in plan.followers.items():
            assert trainer not in followers and len(set(followers)) == len(followers)
            assert 1 <= len(followers) <= min(2, m - 1)
            assert set(followers) == {y for y in members
                                      if follows_by_spec(members, classes, seed, y, trainer)}
            if len(followers) < min(2, m - 1):
                # fewer than F only where a same-class follower is also the global one
                replay_class = classes[trainer]
                assert replay_class and sum(classes[y] == replay_class for y in members) == 2


def test_the_epoch_plan_uses_listed_and_exited_clients_classes() -> None:
    members = members_of(8)
    classes = {x: 5 if i < 4 else 6 for i, x in enumerate(members)}
    clients = [Client(x, replay_class=classes[x]) for x in members[:6]]
    exited = [Client(x, replay_class=classes[x]) for x in members[6:]]
    epoch = EpochState(clients=clients[::-1], exited_clients=exited, verification_seed=77)
    assert epoch_members(epoch) == members
    assert plan_for_epoch(epoch, 100) == follow_plan(members, 77, 100, classes)
    assert plan_for_epoch(epoch, 100) != follow_plan(members, 77, 100)


def warmed_up(classes: dict[NodeIdentity, int] | None,
              verification_percent: int = 0) -> Coordinator:
    """Four joiners warmed up; verification off by default, so that classes 1, 1 and 65535
    are all listed (with it on, a class fewer than 3 of 4 joiners share is not:
    test_replay_class_eligibility.py)."""
    coordinator = Coordinator.from_state_file(state_file(
        verification_percent=verification_percent, min_clients=3, init_min_clients=4,
        witness_nodes=0))
    nodes = [key(i) for i in range(4)]
    for now in range(1_000, 100_000, 50):
        coordinator.tick(nodes, now, 99, classes)
        if coordinator.state.run_state is RunState.Warmup:
            return coordinator
    raise AssertionError("never warmed up")


def test_a_warmup_keeps_the_joiners_classes_and_the_wire_carries_them() -> None:
    classes = {key(0): 1, key(1): 1, key(2): 65535}
    state = warmed_up(classes).state
    assert [c.replay_class for c in state.epoch_state.clients] == [1, 1, 65535, 0]
    assert decode_state(encode(state)) == state
    # an exited client keeps its class
    state.epoch_state.clients[2].state = state.epoch_state.clients[2].state.Withdrawn
    Coordinator(state).move_clients_to_exited(0)
    assert [c.replay_class for c in state.epoch_state.exited_clients] == [65535]
    assert decode_state(encode(state)) == state


def test_no_classes_warm_up_as_class_0() -> None:
    assert [c.replay_class for c in warmed_up(None).state.epoch_state.clients] == [0] * 4
    verified = warmed_up(None, verification_percent=50)
    assert [c.replay_class for c in verified.state.epoch_state.clients] == [0] * 4


def test_a_class_that_is_not_a_u16_is_refused_and_changes_nothing() -> None:
    coordinator = Coordinator.from_state_file(state_file(init_min_clients=1, min_clients=1))
    before = encode(coordinator.state)
    rejected = coordinator.tick([key(0)], 1_000, 1, {key(0): 65536})
    assert isinstance(rejected, Rejected) and rejected.error is CoordinatorError.WrongRunState
    assert "replay class 65536" in str(rejected) and "not a u16" in str(rejected)
    assert encode(coordinator.state) == before
    coordinator.state.epoch_state.clients = [Client(key(0), replay_class=70_000)]
    with pytest.raises(ValueError, match=r"replay_class 70000 is not a u16") as raised:
        encode(coordinator.state)
    assert "\n" not in str(raised.value)


def test_a_version_4_state_decodes_with_class_0_and_version_5_round_trips() -> None:
    state = warmed_up({key(0): 3, key(1): 3, key(2): 9, key(3): 9}).state
    v5 = encode(state)
    assert struct.unpack_from("<H", v5, 4) == (5,)
    assert decode_state(v5) == state
    v4 = encode(state, version=4)
    assert struct.unpack_from("<H", v4, 4) == (4,)
    assert len(v5) - len(v4) == 2 * len(state.epoch_state.clients)
    decoded = decode_state(v4)
    assert [c.replay_class for c in decoded.epoch_state.clients] == [0] * 4
    for client in state.epoch_state.clients:
        client.replay_class = 0
    assert decoded == state
    # a v5 state cut inside a client's class is refused in one line
    cut = v5[:v5.index(state.epoch_state.clients[0].id.key) + 32 + 1 + 4 + 1 + 1]
    with pytest.raises(StateDecodeError, match="truncated") as raised:
        decode_state(cut)
    assert "\n" not in str(raised.value)
