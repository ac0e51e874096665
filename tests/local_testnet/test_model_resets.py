"""The testnet's live count of model resets, fed the states of a real coordinator: an
epoch that starts from the stored checkpoint after one whose clients held a newer model
is a reset; it counts as one "with a holder" while a holder is alive (not killed since
the cooldown, or restarted with its checkpoint of it on disk)."""

from __future__ import annotations

from pathlib import Path

from tcp_helpers import make_state_file

from coordinator import (
    Bloom,
    Coordinator,
    NodeIdentity,
    RunState,
    Witness,
    participant_item,
    selection_for_round,
)
from coordinator.config import HubCheckpoint, P2PCheckpoint
from local_testnet.model_resets import ModelResets, checkpoint_finder
from local_testnet.summary_words import describe_summary
from local_testnet.testnet import client_key

KEYS = {i: client_key(i) for i in (1, 2, 3, 4, 5)}


def node(i: int) -> NodeIdentity:
    return NodeIdentity(KEYS[i])


def epoch_then_new_clients(resets: ModelResets, between: object = None) -> Coordinator:
    """Epoch 0 with clients 1-3 (two rounds, the second unwitnessed: they stay and hold
    the model), its cooldown, then clients 4 and 5 only: the run waits for a holder
    (model_lost) until the operator accepts the loss, and the next epoch starts from the
    stored checkpoint. `between()` runs after the cooldown began."""
    coordinator = Coordinator.from_state_file(make_state_file(
        init_min_clients=2, min_clients=2, witness_nodes=1, warmup_time=10,
        max_round_train_time=5, round_witness_time=2, cooldown_time=3))
    state = coordinator.state

    def tick(pending: list[int], now: int) -> None:
        coordinator.tick([node(i) for i in pending], now, now)
        resets.observe(state, KEYS)

    tick([1, 2, 3], 100)
    tick([], 110)
    assert state.run_state is RunState.RoundTrain
    selection = selection_for_round(state)
    for index in selection.witness_indices():
        bloom = Bloom(keys=tuple(range(8)))
        for client in state.epoch_state.clients:
            bloom.add(participant_item(client.id.key))
        assert coordinator.witness(state.epoch_state.clients[index].id,
                                   Witness(selection.witness_of(index), participant_bloom=bloom),
                                   111) is None
    tick([], 113)  # witnessed: round 1
    tick([], 118)  # round 1 unwitnessed: RoundWitness
    tick([], 120)  # Cooldown, the clients stay
    assert state.run_state is RunState.Cooldown
    if callable(between):
        between()
    tick([], 123)
    assert isinstance(state.model.checkpoint, P2PCheckpoint)
    now = 124
    while state.run_state is RunState.WaitingForMembers and now < 200:
        tick([4, 5], now)
        now += 1
    assert state.run_state is RunState.WaitingForMembers and state.model_lost
    assert resets.count == 0  # waiting loses nothing yet
    assert coordinator.accept_model_loss() is None
    tick([4, 5], now)
    assert state.run_state is RunState.Warmup
    assert isinstance(state.model.checkpoint, HubCheckpoint)
    return coordinator


def test_a_reset_with_its_holders_alive_counts_as_one_with_a_holder() -> None:
    resets = ModelResets(lambda client, step: False)
    coordinator = epoch_then_new_clients(resets)
    [reset] = resets.resets
    assert reset.epoch == 1 and reset.step == coordinator.state.epoch_state.start_step
    assert reset.holders_alive == (1, 2, 3)
    assert (resets.count, resets.with_holder) == (1, 1)


def test_a_reset_after_every_holder_was_killed_has_none(tmp_path: Path) -> None:
    resets = ModelResets(checkpoint_finder(tmp_path, "run"))

    def kill_all() -> None:
        for i in (1, 2, 3):
            resets.killed(i)

    coordinator = epoch_then_new_clients(resets, kill_all)
    assert resets.resets[0].holders_alive == ()
    assert (resets.count, resets.with_holder, resets.epochs) == (1, 0, [1])
    # Had client 2 written its checkpoint of that cooldown, its restart would hold the model.
    start = coordinator.state.epoch_state.start_step
    (tmp_path / "client-2" / "checkpoints" / f"run-step{start - 1}").mkdir(parents=True)
    (tmp_path / "client-2" / "checkpoints" / f"run-step{start - 1}" / "config.json").write_text("{}")
    again = ModelResets(checkpoint_finder(tmp_path, "run"))

    def kill_all_again() -> None:
        for i in (1, 2, 3):
            again.killed(i)

    epoch_then_new_clients(again, kill_all_again)
    assert again.resets[0].holders_alive == (2,) and again.with_holder == 1


def test_an_epoch_continuing_from_its_holders_is_no_reset() -> None:
    resets = ModelResets(lambda client, step: False)
    coordinator = Coordinator.from_state_file(make_state_file(
        init_min_clients=2, min_clients=2, warmup_time=10))
    coordinator.tick([node(1), node(2)], 100, 1)
    resets.observe(coordinator.state, KEYS)  # the first epoch loads the stored model
    assert resets.count == 0


def test_the_summary_says_a_reset_in_words() -> None:
    summary = {"first_loss": 10.0, "last_loss": 9.0, "steps": 5, "epochs": 2,
               "clients_identical": True, "killed": 4, "rejoined": 3, "wall_s": 60.0,
               "finished": True, "final_step": 9, "run_state": "Finished",
               "checkpoints_compared": 3, "models_reset": 2, "models_reset_with_holder": 1,
               "error": None}
    assert describe_summary(summary)[4] == (
        "MODEL RESET 2 times: an epoch went back to the stored checkpoint, its training "
        "since lost (1 while a client holding the model was alive)")
    assert not any("RESET" in line for line in describe_summary(
        {**summary, "models_reset": 0, "models_reset_with_holder": 0}))


def test_the_summary_and_the_tui_say_a_lost_model(tmp_path: Path) -> None:
    """A run that stopped waiting for a holder of its model says so, in the summary's
    words and the testnet TUI's status."""
    from tcp_helpers import TESTNET

    from local_testnet.testnet import Testnet, TestnetOptions
    from local_testnet.tui import TestnetApp
    from psyche_common.ui.view import MODEL_LOST

    summary = {"finished": False, "run_state": "WaitingForMembers", "final_step": 9,
               "coordinator_model_lost": True, "error": None}
    assert MODEL_LOST in describe_summary(summary)
    assert MODEL_LOST not in describe_summary({**summary, "coordinator_model_lost": False})
    net = Testnet(TestnetOptions(num_clients=3, config_path=TESTNET, work_dir=tmp_path,
                                 server_port=1))
    net.state = Coordinator.from_state_file(make_state_file()).state
    net.state.model_lost = True
    assert TestnetApp(net).model_reset_text() == "\n" + MODEL_LOST
    assert net.summary()["coordinator_model_lost"] is True


def test_the_testnet_tui_says_a_reset_and_whether_a_holder_was_alive(tmp_path: Path) -> None:
    from tcp_helpers import TESTNET

    from local_testnet.testnet import Testnet, TestnetOptions
    from local_testnet.tui import TestnetApp

    net = Testnet(TestnetOptions(num_clients=3, config_path=TESTNET, work_dir=tmp_path,
                                 server_port=1))
    app = TestnetApp(net)
    assert app.model_reset_text() == ""
    coordinator = epoch_then_new_clients(net.model_resets)  # holders 1-3 alive
    net.state = coordinator.state
    assert net.state.model_resets == 1
    assert app.model_reset_text().splitlines()[-1] == (
        "MODEL RESET 1 time: an epoch went back to the stored checkpoint, no client holding "
        "the newer model came back (1 with a holder alive)")
    assert app.server_text().endswith(app.model_reset_text())
