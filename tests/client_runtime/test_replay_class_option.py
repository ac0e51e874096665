"""`--replay-class` / REPLAY_CLASS: "machine" (the default) joins with the class of the
settings this client's trainer declares; "none" joins as class 0, the way out for a client
of rare hardware that a verified run would otherwise keep waiting for clients of its class
(the coordinator's `replay_class` notice names the option). Anything else is a one-line
usage error naming the option and both values."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from client_cli_probe import config_from, one_line_usage_error
from tcp_helpers import identity, make_state_file

from client_image.client_config import ClientConfig
from client_image.p2p import NodeConfig
from client_image.runtime.client import (
    ClientOptions,
    PsycheClient,
    join_replay_class,
    own_replay_class,
)
from client_image.runtime.observability import EventLog
from coordinator import Coordinator, NodeIdentity, RunState
from coordinator_tcp.connections import Peer
from coordinator_tcp.server import waiting_notices
from psyche_common.identity import Identity


def test_the_flag_and_its_environment_variable_reach_the_config() -> None:
    assert config_from([], {}).verification.replay_class == "machine"
    assert config_from([], {"REPLAY_CLASS": "none"}).verification.replay_class == "none"
    assert config_from([], {"REPLAY_CLASS": "machine"}).verification.replay_class == "machine"
    assert config_from(["--replay-class", "none"], {}).verification.replay_class == "none"
    # the flag wins over the variable
    assert config_from(["--replay-class", "machine"],
                       {"REPLAY_CLASS": "none"}).verification.replay_class == "machine"


@pytest.mark.parametrize(("args", "env"), [
    ([], {"REPLAY_CLASS": "off"}),
    (["--replay-class", "NONE"], {}),
    (["--replay-class", "0"], {}),
])
def test_a_bad_value_is_a_one_line_usage_error(args: list[str], env: dict[str, str]) -> None:
    one_line_usage_error(args, env, "--replay-class", "'machine', 'none'",
                         marker="Invalid value")


def test_none_joins_as_class_zero_and_machine_with_its_own_class() -> None:
    own = own_replay_class("cpu", None, "fp32", 2)
    assert own != 0  # a real class: "none" is a change
    assert join_replay_class("machine", "cpu", None, "fp32", 2) == own
    assert join_replay_class("none", "cpu", None, "fp32", 2) == 0
    # the micro-batch size enters the class, so the arguments reach own_replay_class
    assert join_replay_class("machine", "cpu", None, "fp32", 4) == own_replay_class(
        "cpu", None, "fp32", 4) != own


@pytest.mark.parametrize("choice", ["machine", "none"])
def test_the_client_joins_with_the_class_its_option_chooses(choice: str) -> None:
    config = ClientConfig.of(run_id="r", device="cpu", micro_batch_size=2,
                             replay_class=choice)
    client = PsycheClient(ClientOptions(config, identity=Identity.generate(),
                                        node_config=NodeConfig.loopback()),
                          EventLog("none"))
    try:
        expected = (0 if choice == "none" else own_replay_class(
            "cpu", client.worker.rank_setup, client.worker.compute, 2))
        assert client.replay_class == expected
        assert (client.replay_class == 0) == (choice == "none")
    finally:
        client.worker.close()


def test_a_client_waiting_for_its_class_is_told_of_replay_class_none() -> None:
    state = Coordinator.from_state_file(make_state_file(
        verification_percent=50, init_min_clients=3)).state
    assert state.run_state is RunState.WaitingForMembers
    rare, others = identity(9), [identity(i) for i in (1, 2, 3)]
    pending = [NodeIdentity(who.public_key) for who in (rare, *others)]
    classes = dict(zip(pending, (0x7777, 0x51A3, 0x51A3, 0x51A3), strict=True))
    # waiting_notices reads who a peer is and what it was told; it writes nothing
    writer = cast(asyncio.StreamWriter, None)
    peer = Peer(pending[0], "", writer, replay_class=0x7777)
    told = list(waiting_notices(state, pending, [peer], classes))
    assert [(p, code) for p, code, _ in told] == [(peer, "replay_class")]
    assert told[0][2] == (
        "waiting for 2 more clients of this client's replay class: a verified run lists a "
        "class only when at least 3 of its joiners (2 when only 2 joined) share it, so that "
        "its followers can replay it; or restart this client with REPLAY_CLASS=none to join "
        "without a class, judged with the loose limits")
