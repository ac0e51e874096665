"""The coordinator state sent as patches after the first whole state
(coordinator_tcp.state_delta): a receiver ends with the server's exact bytes; one that
misses a patch asks once and recovers; a corrupt or hostile patch is a gap, never an
exception; a witness costs a client a few hundred bytes instead of the whole state."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
import tomllib

import bsdiff4
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tcp_helpers import ROOT, identity, join
from test_state_address_deltas import Follower, clocked_server, step

from coordinator import (
    Bloom,
    Coordinator,
    NodeIdentity,
    RunState,
    Witness,
    encode_state,
    participant_item,
    selection_for_round,
)
from coordinator.config import state_file_from_dict
from coordinator_tcp.protocol import ResyncAddresses, StateUpdate
from coordinator_tcp.state_delta import MAX_STATE_BYTES, StateDeltas, StateMirror, state_digest

pytestmark = pytest.mark.timeout(120)


def updates(states: list[bytes]) -> list[StateUpdate]:
    """What a server broadcasts for `states`: the first whole, then patches."""
    deltas, out = StateDeltas(), []
    for data in states:
        seq, patch, digest = deltas.advance(data)
        out.append(StateUpdate(state="" if patch else base64.b64encode(data).decode(),
                               state_seq=seq, state_delta=patch or "", state_digest=digest))
    return out


def round_states(clients: int = 256, witnesses: int = 32) -> list[bytes]:
    """A real coordinator's encoded states over a round: warm-up, then one per witness."""
    data = tomllib.loads((ROOT / "config" / "llama2-20m-dev" / "state.toml").read_text())
    data["config"].update(min_clients=witnesses, init_min_clients=clients,
                          witness_nodes=witnesses, global_batch_size_start=1024,
                          global_batch_size_end=1024, epoch_time=10**9)
    coordinator = Coordinator.from_state_file(state_file_from_dict(data))
    nodes = [NodeIdentity(hashlib.sha256(i.to_bytes(4, "little")).digest())
             for i in range(clients)]
    now = 1000
    coordinator.tick(nodes, now, 1)
    now += coordinator.state.config.warmup_time
    coordinator.tick([], now, 2)
    assert coordinator.state.run_state is RunState.RoundTrain
    states = [encode_state(coordinator.state)]
    bloom = Bloom(keys=tuple(range(8)))
    for node in nodes:
        bloom.add(participant_item(node.key))
    state = coordinator.state
    selection = selection_for_round(state)
    for i in selection.witness_indices():
        assert coordinator.witness(state.epoch_state.clients[i].id,
                                   Witness(selection.witness_of(i), participant_bloom=bloom),
                                   now) is None
        states.append(encode_state(state))
    return states


def test_a_mirror_ends_with_the_servers_bytes_and_patches_are_small() -> None:
    states = round_states()
    sent = updates(states)
    mirror = StateMirror()
    for update, expected in zip(sent, states, strict=True):
        data, ask = mirror.apply(update)
        assert data == expected and not ask
    patch_sizes = [len(update.to_frame()) for update in sent[1:]]
    assert max(patch_sizes) < 1024 < len(states[-1]) // 16, (patch_sizes, len(states[-1]))


def test_a_missed_patch_is_a_gap_asked_for_once_then_a_whole_state_recovers() -> None:
    states = round_states(clients=8, witnesses=4)
    sent = updates(states)
    mirror = StateMirror()
    assert mirror.apply(sent[0]) == (states[0], False)
    assert mirror.apply(sent[2]) == (None, True)  # 1 was lost: ask
    assert mirror.apply(sent[3]) == (None, False)  # asked already: wait for it
    whole = StateUpdate(state=base64.b64encode(states[3]).decode(), state_seq=4)
    assert mirror.apply(whole) == (states[3], False)
    assert mirror.apply(sent[4]) == (states[4], False) and mirror.gaps == 1


def _header(control: int, diff: int, length: int) -> bytes:
    return struct.pack("<8sqqq", b"BSDIFF40", control, diff, length)


@pytest.mark.parametrize("delta", [
    "not base64!",
    base64.b64encode(b"short").decode(),
    base64.b64encode(b"BSDIFF41" + bytes(24)).decode(),
    base64.b64encode(_header(10, 10, MAX_STATE_BYTES + 1) + bytes(20)).decode(),
    base64.b64encode(_header(-1, 0, 10)).decode(),
    base64.b64encode(_header(1000, 1000, 10) + bytes(10)).decode(),
    base64.b64encode(_header(14, 14, 10) + b"BZh9" + bytes(40)).decode(),
])
def test_a_corrupt_or_hostile_patch_is_a_gap(delta: str) -> None:
    mirror = StateMirror()
    mirror.apply(StateUpdate(state=base64.b64encode(b"state one").decode(), state_seq=1))
    update = StateUpdate(state_seq=2, state_delta=delta, state_digest="00")
    assert mirror.apply(update) == (None, True)
    assert mirror.current == b"state one"  # what it held is untouched


def test_a_patch_giving_other_bytes_than_the_digest_says_is_a_gap() -> None:
    mirror = StateMirror()
    mirror.apply(StateUpdate(state=base64.b64encode(b"one").decode(), state_seq=1))
    patch = base64.b64encode(bsdiff4.diff(b"one", b"two")).decode()
    assert mirror.apply(StateUpdate(state_seq=2, state_delta=patch,
                                    state_digest=state_digest(b"three"))) == (None, True)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_random_patch_bytes_never_raise(noise: bytes) -> None:
    base = hashlib.sha256(noise).digest() * 4
    for delta in (noise, _header(len(noise) // 2, len(noise) // 2, 64) + noise):
        mirror = StateMirror()
        mirror.apply(StateUpdate(state=base64.b64encode(base).decode(), state_seq=1))
        data, _ask = mirror.apply(StateUpdate(
            state_seq=2, state_delta=base64.b64encode(delta).decode(), state_digest="0"))
        assert data is None or state_digest(data) == "0"


# ------------------------------------------------------------------ through the server
async def test_clients_get_patches_and_one_that_drops_one_resyncs_to_the_servers_bytes(
) -> None:
    server, clock = clocked_server(init_min_clients=2)
    await server.start()
    followers: list[tuple[Follower, StateMirror, asyncio.Task[None]]] = []
    try:
        for i, drop_one in ((1, False), (2, True)):
            follower = Follower(await join(server, identity(i)))
            mirror = StateMirror()
            dropped: list[int] = []

            def drop(update: StateUpdate, dropped: list[int] = dropped,
                     drop_one: bool = drop_one) -> bool:
                if drop_one and update.state_delta and not dropped:
                    dropped.append(update.state_seq)
                    return True
                return False

            follower.drop = drop

            async def keep(follower: Follower = follower, mirror: StateMirror = mirror) -> None:
                seen = 0
                while True:
                    await asyncio.sleep(0.01)
                    for update in follower.states[seen:]:
                        _data, ask = mirror.apply(update)
                        if ask:
                            await follower.connection.send(ResyncAddresses())
                    seen = len(follower.states)

            followers.append((follower, mirror, asyncio.create_task(follower.run())))
            followers.append((follower, mirror, asyncio.create_task(keep())))
        await step(server, clock, 2, lambda: server.state.run_state is RunState.Warmup)
        await step(server, clock, 3)  # warm-up passes: a state change or two more
        expected = encode_state(server.state)
        for _ in range(250):
            if all(mirror.current == expected for _, mirror, _ in followers):
                break
            await asyncio.sleep(0.02)
        assert [mirror.current == expected for _, mirror, _ in followers] == [True] * 4
        steady, dropper = followers[0][0], followers[2][0]
        assert dropper.dropped == 1 and followers[2][1].gaps == 1
        patches = [update for update in steady.states if update.state_delta]
        assert patches and all(not update.state for update in patches)
        assert max(len(update.to_frame()) for update in patches) < len(expected)
    finally:
        for _follower, _mirror, task in followers:
            task.cancel()
        await asyncio.gather(*(task for *_, task in followers), return_exceptions=True)
        await server.stop()


def test_the_server_numbers_each_broadcast_and_patches_from_the_previous_one() -> None:
    deltas = StateDeltas()
    assert deltas.advance(b"a" * 100) == (1, None, state_digest(b"a" * 100))
    seq, patch, digest = deltas.advance(b"a" * 99 + b"b")
    assert seq == 2 and patch is not None and digest == state_digest(b"a" * 99 + b"b")
    assert bsdiff4.patch(b"a" * 100, base64.b64decode(patch)) == b"a" * 99 + b"b"
    assert deltas.current == b"a" * 99 + b"b"

