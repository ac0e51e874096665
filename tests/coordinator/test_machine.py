"""One or more tests per transition and per event, including every rejection (checkpoint
reports: test_checkpoint_reports.py).

Every rejection is also checked to leave the serialized state byte-for-byte unchanged.
"""

from __future__ import annotations

import pytest
from coordinator_sim import VirtualRun, node, seed_at, state_file

from coordinator import (
    Bloom,
    ClientState,
    Committee,
    CommitteeProof,
    Coordinator,
    CoordinatorError,
    Rejected,
    RunState,
    TickResult,
    Witness,
    WitnessProof,
    decode_state,
    encode_state,
    participant_item,
    selection_for_round,
)
from coordinator.config import HubCheckpoint, P2PCheckpoint


def make(clients: int = 4, **config: object) -> tuple[Coordinator, VirtualRun]:
    defaults: dict[str, object] = {
        "min_clients": 2, "init_min_clients": 2, "witness_nodes": 2, "warmup_time": 10,
        "max_round_train_time": 5, "round_witness_time": 2, "epoch_time": 1000,
        "cooldown_time": 3,
    }
    defaults.update(config)
    coordinator = Coordinator.from_state_file(state_file(**defaults))
    return coordinator, VirtualRun(coordinator, clients)


def rejected(coordinator: Coordinator, call: object, error: CoordinatorError) -> None:
    before = encode_state(coordinator.state)
    result = call() if callable(call) else call
    assert isinstance(result, Rejected) and result.error is error, result
    assert encode_state(coordinator.state) == before


def to_warmup(coordinator: Coordinator, clients: int = 4, now: int = 100) -> int:
    assert coordinator.tick([node(i) for i in range(clients)], now, 1) is TickResult.Ticked
    assert coordinator.state.run_state is RunState.Warmup
    return now


def to_round_train(coordinator: Coordinator, clients: int = 4) -> int:
    now = to_warmup(coordinator, clients)
    now += coordinator.state.config.warmup_time
    coordinator.tick([], now, 77)
    assert coordinator.state.run_state is RunState.RoundTrain
    return now


def send_witnesses(coordinator: Coordinator, now: int, bloom_of: list[int] | None = None) -> None:
    state = coordinator.state
    for index in selection_for_round(state).witness_indices():
        bloom = Bloom(keys=tuple(range(8)))
        for i, client in enumerate(state.epoch_state.clients):
            if bloom_of is None or i in bloom_of:
                bloom.add(participant_item(client.id.key))
        proof = selection_for_round(state).witness_of(index)
        assert coordinator.witness(state.epoch_state.clients[index].id,
                                   Witness(proof, participant_bloom=bloom), now) is None


def finish_round(coordinator: Coordinator, now: int, bloom_of: list[int] | None = None) -> int:
    send_witnesses(coordinator, now, bloom_of)
    assert coordinator.state.run_state is RunState.RoundWitness
    now += coordinator.state.config.round_witness_time
    coordinator.tick([], now, seed_at(now))
    return now


# ------------------------------------------------------------------- tick


@pytest.mark.parametrize("run_state", ["Paused", "Finished", "Uninitialized"])
def test_tick_halted(run_state: str) -> None:
    coordinator = Coordinator.from_state_file(state_file(run_state=run_state))
    rejected(coordinator, lambda: coordinator.tick([node(0), node(1)], 50, 1),
             CoordinatorError.Halted)


def test_waiting_for_members_needs_enough_pending_and_grace() -> None:
    coordinator, _ = make()
    assert coordinator.tick([node(0)], 100, 1) is TickResult.Ticked
    assert coordinator.state.run_state is RunState.WaitingForMembers
    coordinator.state.run_state_start_unix_timestamp = 100
    coordinator.tick([node(0), node(1)], 101, 1)  # grace of 3 s not over
    assert coordinator.state.run_state is RunState.WaitingForMembers
    coordinator.tick([node(0), node(1), node(0)], 103, 1)
    state = coordinator.state
    assert state.run_state is RunState.Warmup and state.run_state_start_unix_timestamp == 103
    assert [c.id for c in state.epoch_state.clients] == [node(0), node(1)]  # deduplicated
    assert state.epoch_state.first_round and state.epoch_state.start_step == 1


def test_waiting_for_members_caps_at_256_clients() -> None:
    coordinator, _ = make()
    coordinator.tick([node(i) for i in range(300)], 100, 1)
    assert len(coordinator.state.epoch_state.clients) == 256


def test_warmup_timeout_starts_first_round() -> None:
    coordinator, _ = make()
    now = to_warmup(coordinator)
    coordinator.tick([], now + 9, 5)
    assert coordinator.state.run_state is RunState.Warmup
    coordinator.tick([], now + 10, 5)
    round_ = coordinator.state.current_round
    assert coordinator.state.run_state is RunState.RoundTrain
    assert (round_.height, round_.data_index, round_.random_seed, round_.clients_len) == (0, 0, 5, 4)


def test_warmup_witnesses_start_round_early_and_rejections() -> None:
    coordinator, _ = make(witness_nodes=2)
    now = to_warmup(coordinator)
    first = Witness(WitnessProof(0, 0, False))
    rejected(coordinator, lambda: coordinator.warmup_witness(node(0), Witness(WitnessProof(9, 9, False)), now, 1), CoordinatorError.InvalidClientIndex)
    rejected(coordinator, lambda: coordinator.warmup_witness(node(1), first, now, 1), CoordinatorError.NotYourIndex)
    assert coordinator.warmup_witness(node(0), first, now, 1) is None
    rejected(coordinator, lambda: coordinator.warmup_witness(node(0), first, now, 1), CoordinatorError.DuplicateWitness)
    assert coordinator.warmup_witness(node(1), Witness(WitnessProof(1, 1, False)), now + 1, 9) is None
    assert coordinator.state.run_state is RunState.RoundTrain
    assert coordinator.state.current_round.random_seed == 9
    assert coordinator.warmup_witness(node(2), Witness(WitnessProof(2, 2, False)), now, 1) is None  # late: OK


def test_warmup_witness_wrong_state() -> None:
    coordinator, _ = make()
    rejected(coordinator, lambda: coordinator.warmup_witness(node(0), Witness(WitnessProof(0, 0, False)), 5, 1), CoordinatorError.WrongRunState)


def test_warmup_losing_clients_ends_epoch_unsuccessfully() -> None:
    coordinator, _ = make(min_clients=3, init_min_clients=3, witness_nodes=1)
    now = to_warmup(coordinator, clients=3)
    assert coordinator.withdraw(0) is None
    assert coordinator.tick([], now + 1, 1) is TickResult.EpochEndFailure
    state = coordinator.state
    assert state.run_state is RunState.WaitingForMembers
    assert [c.id for c in state.epoch_state.exited_clients] == [node(0)]
    assert state.epoch_state.exited_clients[0].state is ClientState.Withdrawn


def test_round_train_timeout_and_early_witness() -> None:
    coordinator, _ = make()
    now = to_round_train(coordinator)
    coordinator.tick([], now + 4, 1)
    assert coordinator.state.run_state is RunState.RoundTrain
    coordinator.tick([], now + 5, 1)
    assert coordinator.state.run_state is RunState.RoundWitness
    coordinator2, _ = make()
    now = to_round_train(coordinator2)
    send_witnesses(coordinator2, now + 1)
    assert coordinator2.state.run_state is RunState.RoundWitness
    assert coordinator2.state.run_state_start_unix_timestamp == now + 1


def test_witness_rejections() -> None:
    coordinator, _ = make()
    rejected(coordinator, lambda: coordinator.witness(node(0), Witness(WitnessProof(0, 0, True)), 1), CoordinatorError.WrongRunState)
    now = to_round_train(coordinator)
    state = coordinator.state
    selection = selection_for_round(state)
    chosen = selection.witness_indices()[0]
    other = next(i for i in range(4) if i not in selection.witness_indices())
    proof = selection.witness_of(chosen)
    sender = state.epoch_state.clients[chosen].id
    rejected(coordinator, lambda: coordinator.witness(sender, Witness(WitnessProof(proof.position, chosen, False)), now), CoordinatorError.InvalidWitnessProof)
    rejected(coordinator, lambda: coordinator.witness(state.epoch_state.clients[other].id, Witness(selection.witness_of(other)), now), CoordinatorError.InvalidWitnessProof)
    rejected(coordinator, lambda: coordinator.witness(state.epoch_state.clients[other].id, Witness(proof), now), CoordinatorError.NotYourIndex)
    assert coordinator.witness(sender, Witness(proof), now) is None
    rejected(coordinator, lambda: coordinator.witness(sender, Witness(proof), now), CoordinatorError.DuplicateWitness)


def test_round_witness_timeout_starts_next_round() -> None:
    coordinator, _ = make(global_batch_size_start=4, global_batch_size_end=4)
    now = to_round_train(coordinator)
    now = finish_round(coordinator, now + 1)
    state = coordinator.state
    assert state.run_state is RunState.RoundTrain and state.progress.step == 2
    assert (state.current_round.height, state.current_round.data_index) == (1, 4)
    assert state.epoch_state.rounds_head == 1 and not state.epoch_state.first_round


def test_round_witness_without_witnesses_withdraws_everyone() -> None:
    coordinator, _ = make()
    now = to_round_train(coordinator)
    coordinator.tick([], now + 5, 1)
    coordinator.tick([], now + 7, 1)
    state = coordinator.state
    assert state.run_state is RunState.Cooldown
    assert all(c.state is ClientState.Withdrawn for c in state.epoch_state.clients)


def test_a_later_round_without_witnesses_keeps_the_clients_holding_the_model() -> None:
    """Past the first round every earlier round had a witness quorum: a round whose
    witness died ends the epoch, but its clients stay Healthy, so the next epoch fetches
    the model from those still there (P2P) instead of restarting from the stored one."""
    coordinator, _ = make()
    now = finish_round(coordinator, to_round_train(coordinator) + 1)
    assert coordinator.state.current_round.height == 1
    coordinator.tick([], now + 5, 1)  # RoundTrain times out: RoundWitness, no witness
    coordinator.tick([], now + 7, 1)
    state = coordinator.state
    assert state.run_state is RunState.Cooldown
    assert [c.state for c in state.epoch_state.clients] == [ClientState.Healthy] * 4
    coordinator.tick([], now + 7 + state.config.cooldown_time, 1)
    assert state.run_state is RunState.WaitingForMembers
    assert isinstance(state.model.checkpoint, P2PCheckpoint)
    # Only client 3 of the last epoch is back, with a newcomer: it holds the model.
    later = now + 20
    coordinator.tick([node(3), node(9)], later, 1)
    coordinator.tick([node(3), node(9)], later + state.config.waiting_for_members_extra_time, 1)
    assert state.run_state is RunState.Warmup
    assert isinstance(state.model.checkpoint, P2PCheckpoint)


def test_a_first_round_without_witnesses_falls_back_to_the_stored_checkpoint() -> None:
    coordinator, _ = make()
    now = to_round_train(coordinator)
    coordinator.tick([], now + 5, 1)
    coordinator.tick([], now + 7, 1)
    state = coordinator.state
    coordinator.tick([], now + 7 + state.config.cooldown_time, 1)
    later = now + 20
    clients = [node(i) for i in range(4)]
    coordinator.tick(clients, later, 1)
    coordinator.tick(clients, later + state.config.waiting_for_members_extra_time, 1)
    assert state.run_state is RunState.Warmup
    assert isinstance(state.model.checkpoint, HubCheckpoint)


def test_a_first_round_without_witnesses_keeps_the_last_epochs_clients() -> None:
    """An epoch that continues from the last one's clients (P2P): its first round goes
    unwitnessed (the only witness, a newcomer, never got the model while a restarted
    holder reloaded it). The newcomers are withdrawn, nothing being proven of them, but the
    holders stay, so the next epoch fetches the model from them, never the stored one."""
    coordinator, _ = make(epoch_time=30)
    now = to_round_train(coordinator)
    while coordinator.state.run_state is RunState.RoundTrain:  # epoch 0 ends by its time
        now = finish_round(coordinator, now + 1)
    state = coordinator.state
    assert state.run_state is RunState.Cooldown
    coordinator.tick([], now + state.config.cooldown_time, 1)
    assert state.run_state is RunState.WaitingForMembers
    assert isinstance(state.model.checkpoint, P2PCheckpoint)
    # Epoch 1: client 2 of the last epoch (a holder) and newcomers 7 and 8.
    later = now + 10
    coordinator.tick([node(7), node(2), node(8)], later, 1)
    assert state.run_state is RunState.Warmup
    assert [(c.id, c.holds_model) for c in state.epoch_state.clients] == [
        (node(7), False), (node(2), True), (node(8), False)]
    later += state.config.warmup_time
    coordinator.tick([], later, 5)
    assert state.run_state is RunState.RoundTrain and state.current_round.height == 0
    coordinator.tick([], later + 5, 1)  # RoundTrain times out: RoundWitness, no witness
    coordinator.tick([], later + 7, 1)
    assert state.run_state is RunState.Cooldown
    assert [(c.id, c.state) for c in state.epoch_state.clients] == [
        (node(7), ClientState.Withdrawn), (node(2), ClientState.Healthy),
        (node(8), ClientState.Withdrawn)]
    # The encoded state carries who holds the model (persistence, broadcast).
    assert decode_state(encode_state(state)) == state
    coordinator.tick([], later + 7 + state.config.cooldown_time, 1)
    assert isinstance(state.model.checkpoint, P2PCheckpoint)
    coordinator.tick([node(2), node(9)], later + 20, 1)
    coordinator.tick([node(2), node(9)], later + 20 + state.config.waiting_for_members_extra_time,
                     1)
    assert state.run_state is RunState.Warmup
    assert isinstance(state.model.checkpoint, P2PCheckpoint)  # not the stored model
    assert [c.holds_model for c in state.epoch_state.clients] == [True, False]
    assert state.model_resets == 0


def test_an_epoch_from_the_stored_checkpoint_has_no_holders() -> None:
    """Everyone loads a Hub checkpoint: nobody is a holder, and an unwitnessed first
    round withdraws everyone as before."""
    coordinator, _ = make()
    to_warmup(coordinator)
    assert isinstance(coordinator.state.model.checkpoint, HubCheckpoint)
    assert not any(c.holds_model for c in coordinator.state.epoch_state.clients)


@pytest.mark.parametrize("reason", ["clients", "total_steps", "pause"])
def test_round_witness_goes_to_cooldown(reason: str) -> None:
    coordinator, _ = make(total_steps=2 if reason == "total_steps" else 100)
    now = to_round_train(coordinator)
    if reason == "clients":
        for index in range(3):
            coordinator.withdraw(index)
    if reason == "pause":
        assert coordinator.pause(now) is None and coordinator.state.pending_pause
    finish_round(coordinator, now + 1)
    assert coordinator.state.run_state is RunState.Cooldown
    assert coordinator.state.current_round.witnesses == []


def test_epoch_time_sets_last_step_then_cooldown() -> None:
    coordinator, _ = make(epoch_time=30)
    now = to_round_train(coordinator)
    while coordinator.state.epoch_state.last_step == 0:
        now = finish_round(coordinator, now + 1)
    last = coordinator.state.epoch_state.last_step
    assert last == coordinator.state.progress.step + 2
    while coordinator.state.run_state is RunState.RoundTrain:
        now = finish_round(coordinator, now + 1)
    assert coordinator.state.run_state is RunState.Cooldown and coordinator.state.progress.step == last


def test_cooldown_ends_epoch_and_promotes_checkpoint() -> None:
    coordinator, _ = make(total_steps=2)
    now = to_round_train(coordinator)
    now = finish_round(coordinator, now + 1)
    assert coordinator.state.run_state is RunState.Cooldown
    assert coordinator.tick([], now + 1, 1) is TickResult.Ticked
    assert coordinator.tick([], now + 3, 1) is TickResult.EpochEndSuccess
    state = coordinator.state
    assert state.run_state is RunState.Finished and state.progress.epoch == 1
    assert state.progress.epoch_start_data_index == 4
    assert isinstance(state.model.checkpoint, P2PCheckpoint)


def test_cooldown_with_pending_pause_pauses_and_resume() -> None:
    coordinator, _ = make()
    now = to_round_train(coordinator)
    coordinator.pause(now)
    now = finish_round(coordinator, now + 1)
    coordinator.tick([], now + 3, 1)
    state = coordinator.state
    assert state.run_state is RunState.Paused and state.epoch_state.cold_start_epoch
    assert not state.pending_pause
    rejected(coordinator, lambda: coordinator.pause(now), CoordinatorError.Halted)
    assert coordinator.resume(now + 10) is None
    assert state.run_state is RunState.WaitingForMembers
    rejected(coordinator, lambda: coordinator.resume(now), CoordinatorError.CannotResume)


def test_pause_when_not_active_pauses_now() -> None:
    coordinator, _ = make()
    to_warmup(coordinator)
    assert coordinator.pause(200) is None
    state = coordinator.state
    assert state.run_state is RunState.Paused and state.epoch_state.cold_start_epoch
    assert all(c.state is ClientState.Withdrawn for c in state.epoch_state.clients)


def test_next_epoch_waits_without_previous_clients_until_the_loss_is_accepted() -> None:
    """The model applied training, none of its holders (the clients the pause withdrew)
    comes back and nothing was uploaded: the run waits with `model_lost` instead of going
    on from the stored checkpoint, until its authority accepts the loss."""
    coordinator, _ = make(total_steps=100)
    now = to_round_train(coordinator)
    now = finish_round(coordinator, now + 1)  # round 1 applies round 0: the model moved on
    assert coordinator.state.model_ahead
    coordinator.pause(now)
    now = finish_round(coordinator, now + 1)
    coordinator.tick([], now + 3, 1)
    coordinator.resume(now + 4)
    state = coordinator.state
    assert isinstance(state.model.checkpoint, P2PCheckpoint)
    for later in (now + 10, now + 100):
        coordinator.tick([node(50), node(51)], later, 1)
        assert state.run_state is RunState.WaitingForMembers and state.model_lost
    assert isinstance(state.model.checkpoint, P2PCheckpoint) and state.model_resets == 0
    assert decode_state(encode_state(state)) == state  # persisted and broadcast
    assert coordinator.accept_model_loss() is None
    assert isinstance(state.model.checkpoint, HubCheckpoint)
    assert state.model_resets == 1  # the run says its model went back
    assert not state.model_ahead and not state.model_lost
    coordinator.tick([node(50), node(51)], now + 101, 1)
    assert state.run_state is RunState.Warmup
    assert isinstance(state.model.checkpoint, HubCheckpoint)
    assert state.model_resets == 1  # counted once, at the decision


def _after_first_epoch(checkpoint: HubCheckpoint | None = None) -> tuple[Coordinator, int]:
    """Epoch 0 (clients 0..3) trains until its time is up and ends; the run waits for
    members, its clients holding a model ahead of the stored checkpoint."""
    coordinator, _ = make(total_steps=100, epoch_time=30)
    state = coordinator.state
    if checkpoint is not None:
        state.model = state.model.model_copy(update={"checkpoint": checkpoint})
    now = to_round_train(coordinator)
    while state.run_state is RunState.RoundTrain:
        now = finish_round(coordinator, now + 1)
    now += state.config.cooldown_time
    coordinator.tick([], now, 1)
    assert state.run_state is RunState.WaitingForMembers and state.model_ahead
    assert isinstance(state.model.checkpoint, P2PCheckpoint)
    return coordinator, now


def test_the_run_waits_for_a_holder_and_goes_on_from_it() -> None:
    coordinator, now = _after_first_epoch()
    state = coordinator.state
    newcomers = [node(60), node(61)]
    coordinator.tick(newcomers, now + 10, 1)
    assert state.run_state is RunState.WaitingForMembers and state.model_lost
    rejected(coordinator, lambda: coordinator.resume(now + 10), CoordinatorError.CannotResume)
    coordinator.tick([*newcomers, node(3)], now + 11, 1)  # a holder is back: at once
    assert state.run_state is RunState.Warmup and not state.model_lost
    assert isinstance(state.model.checkpoint, P2PCheckpoint)  # fetched from the holder
    assert [c.holds_model for c in state.epoch_state.clients] == [False, False, True]
    assert state.model_resets == 0


def test_a_checkpoint_report_makes_a_fallback_lose_nothing() -> None:
    """A holder reported its upload of the cooldown's model: the stored checkpoint is as
    new, so a run whose holders are all gone goes on from it without waiting or counting
    a reset."""
    coordinator, now = _after_first_epoch(HubCheckpoint(repo_id="org/model"))
    state = coordinator.state
    coordinator.tick([node(60), node(61)], now + 10, 1)
    assert state.model_lost
    commit = "ab" * 20
    assert coordinator.checkpoint(node(0), 0, HubCheckpoint(repo_id="org/model",
                                                             revision=commit)) is None
    assert not state.model_ahead and not state.model_lost
    coordinator.tick([node(60), node(61)], now + 11, 1)
    assert state.run_state is RunState.Warmup
    assert state.model.checkpoint == HubCheckpoint(repo_id="org/model", revision=commit)
    assert state.model_resets == 0


def test_a_report_during_a_later_round_keeps_the_model_ahead() -> None:
    """A report that arrives once a round past the epoch's first applied training is of
    an older model: the clients' model stays ahead of it."""
    coordinator, _ = make(total_steps=100)
    state = coordinator.state
    state.model = state.model.model_copy(update={"checkpoint": HubCheckpoint(repo_id="org/model")})
    now = to_round_train(coordinator)
    now = finish_round(coordinator, now + 1)
    assert state.run_state is RunState.RoundTrain and state.current_round.height == 1
    assert coordinator.checkpoint(node(0), 0, HubCheckpoint(repo_id="org/model",
                                                             revision="cd" * 20)) is None
    assert state.model_ahead


def test_accept_model_loss_is_refused_when_nothing_would_be_lost() -> None:
    coordinator, _ = make(total_steps=100)
    rejected(coordinator, coordinator.accept_model_loss, CoordinatorError.WrongRunState)
    to_round_train(coordinator)
    rejected(coordinator, coordinator.accept_model_loss, CoordinatorError.WrongRunState)


def test_a_fallback_after_an_epoch_that_applied_nothing_is_no_reset() -> None:
    """The first epoch's only round goes unwitnessed (nobody loaded the model in time):
    nothing was applied, so its fallback to the stored checkpoint loses nothing and is
    not counted."""
    coordinator, _ = make()
    now = to_round_train(coordinator)
    coordinator.tick([], now + 5, 1)
    coordinator.tick([], now + 7, 1)
    state = coordinator.state
    coordinator.tick([], now + 7 + state.config.cooldown_time, 1)
    assert isinstance(state.model.checkpoint, P2PCheckpoint) and not state.model_ahead
    coordinator.tick([node(i) for i in range(4)], now + 20, 1)
    coordinator.tick([node(i) for i in range(4)],
                     now + 20 + state.config.waiting_for_members_extra_time, 1)
    assert isinstance(state.model.checkpoint, HubCheckpoint)
    assert state.model_resets == 0


# ---------------------------------------------------------------- events


def test_withdraw() -> None:
    coordinator, _ = make()
    rejected(coordinator, lambda: coordinator.withdraw(0), CoordinatorError.InvalidClientIndex)
    to_warmup(coordinator)
    assert coordinator.withdraw(1) is None
    assert coordinator.state.epoch_state.clients[1].state is ClientState.Withdrawn
    rejected(coordinator, lambda: coordinator.withdraw(1), CoordinatorError.InvalidWithdraw)
    rejected(coordinator, lambda: coordinator.withdraw(-1), CoordinatorError.InvalidClientIndex)


def test_health_check() -> None:
    coordinator, _ = make()
    now = to_round_train(coordinator)
    state = coordinator.state
    me = state.epoch_state.clients[0].id
    rejected(coordinator, lambda: coordinator.health_check(me, []), CoordinatorError.HealthCheckTooEarly)
    # rounds 0 and 1: the witnesses of round 1 never saw client 3
    now = finish_round(coordinator, now + 1)
    now = finish_round(coordinator, now + 1, bloom_of=[0, 1, 2])
    assert state.current_round.height == 2
    previous = state.previous_round
    assert previous is not None
    selection = selection_for_round(state, previous)
    victim = state.epoch_state.clients[3].id
    proof = selection.committee_of(3)
    healthy_proof = selection.committee_of(1)
    rejected(coordinator, lambda: coordinator.health_check(node(99), [(victim, proof)]), CoordinatorError.NotAClient)
    rejected(coordinator, lambda: coordinator.health_check(me, []), CoordinatorError.InvalidHealthCheck)
    rejected(coordinator, lambda: coordinator.health_check(me, [(victim, proof), (state.epoch_state.clients[1].id, healthy_proof)]), CoordinatorError.InvalidHealthCheck)
    bad = CommitteeProof(Committee.Trainer, (proof.position + 1) % 4, 3)
    rejected(coordinator, lambda: coordinator.health_check(me, [(victim, bad)]), CoordinatorError.InvalidHealthCheck)
    rejected(coordinator, lambda: coordinator.health_check(me, [(node(98), proof)]), CoordinatorError.InvalidHealthCheck)
    assert coordinator.health_check(me, [(victim, proof)]) is None
    assert state.epoch_state.clients[3].state is ClientState.Dropped
    finish_round(coordinator, now + 1, bloom_of=[0, 1, 2])
    assert victim in [c.id for c in state.epoch_state.exited_clients]
    assert state.epoch_state.exited_clients[-1].exited_height == 2


def test_tick_rejects_out_of_range_numbers() -> None:
    coordinator, _ = make()
    rejected(coordinator, lambda: coordinator.tick([], -1, 0), CoordinatorError.WrongRunState)
    rejected(coordinator, lambda: coordinator.tick([], 1, 2**64), CoordinatorError.WrongRunState)


def test_history_lookup_of_exited_clients() -> None:
    coordinator, _ = make()
    now = to_round_train(coordinator)
    state = coordinator.state
    ids = [c.id for c in state.epoch_state.clients]
    coordinator.withdraw(3)
    finish_round(coordinator, now + 1)
    # round 0 had 4 clients; index 3 left and is found at the end of exited_clients
    exited, active = state.client_at(3, 4), state.client_at(1, 4)
    assert exited is not None and exited.id == ids[3]
    assert active is not None and active.id == ids[1]
    assert state.client_at(4, 4) is None
