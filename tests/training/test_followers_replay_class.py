"""Replay classes on the client (issue 36): the class a client joins with, and a follower of
a trainer's own class failing a result that declares settings of another class (the
loophole of joining with a follower's class and declaring what nobody there reproduces),
and one declaring settings of its class that the follower cannot reproduce (a collision of
16-bit classes). Real trainers and real followers on the CPU."""

from __future__ import annotations

import dataclasses
import hashlib

from follower_setup import (
    declaring_trainers,
    followers_on,
    step_batches,
    tiny_model,
    verify_each,
)

from client_image.formats.replay_settings import (
    ReplaySettings,
    replay_class_of,
    replay_class_of_text,
    replay_class_text,
)
from client_image.runtime.client import own_replay_class
from client_image.runtime.verifying import same_class_trainers
from client_image.training.parallel import ParallelDims
from client_image.training.rank_group import RankSetup
from client_image.verification.followers import (
    OTHER_CLASS,
    SAME_CLASS_REPLAY,
    SAME_CLASS_UNREPRODUCIBLE,
)
from client_image.verification.settings import capture
from coordinator import NodeIdentity
from coordinator.state import Client, EpochState

HONEST, LIAR, STRANGER = b"\x0a" * 32, b"\x0b" * 32, b"\x0c" * 32
COLLIDER = b"\x0d" * 32


def test_the_class_is_the_first_two_bytes_of_the_hash_and_never_0() -> None:
    own = capture("fp32", 2, "cpu")
    text = (f"cpu|{own.torch_version}|{own.hardware}|fp32|auto|{int(own.onednn)}|2|"
            f"{own.threads}")
    assert replay_class_text(own) == text
    digest = hashlib.sha256(text.encode()).digest()
    assert replay_class_of(own) == (int.from_bytes(digest[:2], "little") or 1)
    assert all(0 < replay_class_of_text(f"cuda|2.5.1|GPU {i}") <= 65535 for i in range(2000))
    # a machine whose hash starts with two zero bytes gets class 1 (0 is "none")
    zero = next(f"GPU {i}" for i in range(10**6)
                if hashlib.sha256(f"GPU {i}".encode()).digest()[:2] == b"\0\0")
    assert replay_class_of_text(zero) == 1


def test_every_setting_a_replay_must_match_moves_the_class_and_gpu_threads_do_not() -> None:
    own = capture("fp32", 2, "cpu", threads=4)
    for change in ({"micro_batch": 3}, {"threads": 5}, {"compute": "bf16"},
                   {"attention": "math"}, {"onednn": not own.onednn},
                   {"hardware": "Other CPU"}, {"torch_version": "0.0.1"}):
        assert replay_class_of(dataclasses.replace(own, **change)) != replay_class_of(own), change
    gpu = dataclasses.replace(own, device="cuda", threads=0, hardware="Some GPU")
    # a GPU's numbers do not depend on the host's threads: the class writes 0 for them
    assert replay_class_text(dataclasses.replace(gpu, threads=16)).endswith("|2|0")
    assert replay_class_of(dataclasses.replace(gpu, threads=16)) == replay_class_of(gpu)
    assert replay_class_of(dataclasses.replace(gpu, micro_batch=4)) != replay_class_of(gpu)


def test_a_client_joins_with_the_class_of_what_its_trainer_declares() -> None:
    own = capture("fp32", 1, "cpu")
    assert own_replay_class("cpu", None) == replay_class_of(own)
    assert own_replay_class("cpu", None, "bf16", 4) == replay_class_of(
        capture("bf16", 4, "cpu")) != replay_class_of(own)
    split = RankSetup(ParallelDims(dp=2, tp=1))
    declared_split = dataclasses.replace(own, hardware=own.hardware + " split dp2 tp1")
    assert own_replay_class("cpu", split) == replay_class_of(declared_split) != replay_class_of(own)


def test_same_class_trainers_come_from_the_state() -> None:
    me, a, b, c = (NodeIdentity(bytes([i]) * 32) for i in (1, 2, 3, 4))
    epoch = EpochState(clients=[Client(me, replay_class=9), Client(a, replay_class=9),
                                Client(b, replay_class=8)],
                       exited_clients=[Client(c, replay_class=9)])
    assert same_class_trainers(epoch, me, [a.key, b.key, c.key]) == {a.key: 9, c.key: 9}
    epoch.clients[0].replay_class = 0  # a follower of no class checks nobody
    assert same_class_trainers(epoch, me, [a.key, b.key, c.key]) == {}


def test_a_same_class_trainer_declaring_another_class_fails_and_a_stranger_is_judged_loosely():
    own = capture("fp32", 2, "cpu")
    elsewhere = dataclasses.replace(own, hardware="Some CPU nobody here has")
    # LIAR joined with this follower's class but declares a machine of another class;
    # STRANGER joined with that other class (a global follower): judged loosely, as before.
    declared = {HONEST: own, LIAR: elsewhere, STRANGER: elsewhere}
    trained = declaring_trainers(declared)
    followers = followers_on(tiny_model(), own)
    mine = replay_class_of(own)
    followers.follow(list(declared), start_step=0, joined_classes={HONEST: mine, LIAR: mine})
    verdicts: dict[bytes, list[tuple[bool, str, str]]] = {key: [] for key in declared}
    for step, rows, tokens in step_batches(range(1)):
        for key, checked in verify_each(followers, trained, step, tokens, rows).items():
            verdicts[key].append((checked.verdict.ok, checked.verdict.reason, checked.replayed))
        for trainer in trained.values():
            trainer.idle(step)
    assert verdicts[HONEST] == [(True, "", SAME_CLASS_REPLAY)]
    other = replay_class_of(elsewhere)
    assert verdicts[LIAR] == [(False, OTHER_CLASS, f"other class: joined with {mine}, declared "
                               f"{other} ({elsewhere.describe()})")]
    # honest CPU results, so the loose limits pass them: the loophole a unique class keeps
    assert len(verdicts[STRANGER]) == 1 and all(
        ok and replayed.startswith("cannot replay the declared settings")
        for ok, _, replayed in verdicts[STRANGER])


def colliding_hardware(settings: ReplaySettings) -> str:
    """A hardware string, not `settings`', whose replay class is `settings`' (what about
    2^16 tries find: a collision on purpose, or an honest one)."""
    target = replay_class_of(settings)
    return next(f"Fake CPU {i}" for i in range(10**7)
                if replay_class_of(dataclasses.replace(settings, hardware=f"Fake CPU {i}"))
                == target)


def test_a_same_class_trainer_this_follower_cannot_reproduce_fails_and_a_stranger_does_not():
    own = capture("fp32", 2, "cpu")
    collider = dataclasses.replace(own, hardware=colliding_hardware(own))
    assert replay_class_of(collider) == replay_class_of(own)
    # COLLIDER joined with this follower's class and declares a machine of that class this
    # follower cannot reproduce: it fails (same class means reproducible). STRANGER
    # declares the same machine but joined with another class: its follower is a global
    # one, which judges it loosely, as before.
    declared = {HONEST: own, COLLIDER: collider, STRANGER: collider}
    trained = declaring_trainers(declared)
    followers = followers_on(tiny_model(), own)
    mine = replay_class_of(own)
    followers.follow(list(declared), start_step=0,
                     joined_classes={HONEST: mine, COLLIDER: mine})
    step, rows, tokens = next(step_batches(range(1)))
    verdicts = {key: (checked.verdict.ok, checked.verdict.reason, checked.replayed)
                for key, checked in verify_each(followers, trained, step, tokens, rows).items()}
    why = f"declared hardware {collider.hardware}, this follower's is {own.hardware}"
    assert verdicts[HONEST] == (True, "", SAME_CLASS_REPLAY)
    assert verdicts[COLLIDER] == (False, SAME_CLASS_UNREPRODUCIBLE + why,
                                  f"same class, cannot replay: {why}")
    assert verdicts[COLLIDER][1] == ("joined this follower's replay class but declared "
                                     f"settings it cannot reproduce: {why}")
    ok, reason, replayed = verdicts[STRANGER]
    assert ok and reason == "" and replayed == f"cannot replay the declared settings: {why}"
    assert followers.judged_loosely == {STRANGER: 1}
