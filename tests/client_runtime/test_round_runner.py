"""The round runner driven by a real coordinator and fake ports (runner_swarm.py): the whole
round logic of the client, from warm-up to cooldown, with no network and no model."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from runner_swarm import FakeSwarm, payload_of

from client_image.p2p import Finished, ResultAnnouncement
from client_image.p2p.messages import BatchId
from client_image.runtime.events import (
    Applied,
    BadResult,
    Checkpointed,
    CheckpointFailed,
    Desynced,
    HealthCheckSent,
    ModelLoaded,
    ResultLeftOut,
    TaskFailed,
    Trained,
    WarmupWitnessSent,
    WitnessSent,
)
from client_image.runtime.rounds import my_witness_proof
from coordinator import ClientState, CoordinatorState, NodeIdentity, RunState, selection_for_round
from coordinator.config import HubCheckpoint, P2PCheckpoint
from coordinator.messages import HealthCheck, RoundWitness


def step_reached(step: int) -> Callable[[FakeSwarm], bool]:
    return lambda swarm: swarm.coordinator.state.progress.step >= step


def elected(state: CoordinatorState, who: NodeIdentity) -> bool:
    proof = my_witness_proof(state, who)
    return proof is not None and proof[2]


def health_of(swarm: FakeSwarm, who: NodeIdentity) -> ClientState | None:
    state = swarm.coordinator.state
    index = state.index_of(who)
    return None if index is None else state.epoch_state.clients[index].state


async def test_an_honest_swarm_applies_the_same_consensus_results_everywhere() -> None:
    swarm = FakeSwarm(3)
    await swarm.run_until(step_reached(7))
    # Every runner loaded the model, one (the first W = 1) sent the warm-up witness.
    assert len(swarm.events_of(ModelLoaded)) == 3
    assert len(swarm.events_of(WarmupWitnessSent)) == 1
    # Each step s >= 3 applies step s-2's results, in batch order, identically everywhere.
    applied = [swarm.worker(n).applied for n in swarm.nodes]
    assert applied[0] == applied[1] == applied[2]
    steps = [step for step, _ in applied[0]]
    assert steps == list(range(3, swarm.coordinator.state.progress.step + 1))[:len(steps)]
    assert len(steps) >= 4
    for step, payloads in applied[0]:
        trained = sorted((batch, n.key) for n in swarm.nodes
                         for s, batch in swarm.worker(n).trained if s == step - 2)
        assert payloads == [payload_of(key, step - 2, batch) for batch, key in trained]
    # Every runner gossiped Finished for each step it completed; no one desynced and every
    # witness message the coordinator got was accepted.
    for n in swarm.nodes:
        assert swarm.finished_steps(n)[:4] == [1, 2, 3, 4]
    assert swarm.events_of(Desynced) == []
    assert all(result is None for _, _, result in swarm.sent)


async def test_a_client_without_a_batch_takes_the_steps_weight_decay_instead() -> None:
    # Two sequences a step for three clients: each round one client has no batch. It must
    # still change its weights as the trainers do (weight decay), at that very step.
    swarm = FakeSwarm(3, global_batch_size_start=2, global_batch_size_end=2)
    await swarm.run_until(step_reached(7))
    for n in swarm.nodes:
        worker = swarm.worker(n)
        trained = {step for step, _ in worker.trained}
        assert not trained & set(worker.idled), n
        # every step before the last one reached was either trained or idled, never both
        done = trained | set(worker.idled)
        assert set(range(1, swarm.coordinator.state.progress.step - 1)) <= done, (n, done)
    assert sum(len(swarm.worker(n).idled) for n in swarm.nodes) >= 4


async def test_every_client_leaves_out_the_same_screened_results() -> None:
    # One trainer's results fail a cheap check (here, as every client's screen says so):
    # no client applies them, every client says so, and the screen saw each sender's
    # previous consensus result.
    swarm = FakeSwarm(3)
    cheat = swarm.nodes[2]
    for n in swarm.nodes:
        swarm.worker(n).left_out.add(cheat.key)
    await swarm.run_until(step_reached(8))
    applied = [swarm.worker(n).applied for n in swarm.nodes]
    assert applied[0] == applied[1] == applied[2] and len(applied[0]) >= 4
    for step, payloads in applied[0]:
        cheats = [payload_of(cheat.key, step - 2, batch)
                  for s, batch in swarm.worker(cheat).trained if s == step - 2]
        assert cheats and not set(cheats) & set(payloads), step
        assert len(payloads) == 2  # the two honest trainers' results still apply
    left = [e for _, e in swarm.events if isinstance(e, ResultLeftOut)]
    assert left and {e.trainer for e in left} == {cheat.key.hex()}
    later = [previous for _, _, previous in swarm.worker(swarm.nodes[0]).screened[1:]]
    assert later and all(cheat.key in previous for previous in later)


async def test_only_the_elected_witness_of_a_round_submits_it() -> None:
    swarm = FakeSwarm(3)
    await swarm.run_until(step_reached(5))
    messages = [(who, message) for who, message, _ in swarm.sent] + swarm.inbox
    submitted = [(who, message.metadata.step) for who, message in messages
                 if isinstance(message, RoundWitness)]
    assert submitted
    assert len({step for _, step in submitted}) == len(submitted)  # one per round (W = 1)
    assert len(swarm.events_of(WitnessSent)) == len(submitted)


@pytest.mark.parametrize("cheat_index", [0, 1, 2])
async def test_a_result_that_does_not_match_its_commitment_never_reaches_the_weights(
        cheat_index: int) -> None:
    """The cheat's step-T result reaches the others altered (it does not match the
    commitment it announced). Consensus follows the round-T+1 witness's bloom: if that
    witness is honest the batch is skipped everywhere; if the cheat vouches for itself,
    honest runners cannot get the payload and desync rather than apply anything else."""
    swarm = FakeSwarm(3)
    cheat, target = swarm.nodes[cheat_index], 3
    swarm.corrupt_results_of[(cheat.key, target)] = lambda data: data[:-1] + bytes([data[-1] ^ 1])
    await swarm.run_until(step_reached(target + 3))
    await swarm.drain()  # an apply may still wait for a payload it will never get
    bad = swarm.events_of(BadResult)
    assert {(e.step, e.reason) for e in bad} == {(target, "payload does not match its commitment")}
    assert len(bad) == 2  # both honest runners refused it
    state = swarm.coordinator.state
    cheat_batch = next(batch for s, batch in swarm.worker(cheat).trained if s == target)
    cheat_payload = payload_of(cheat.key, target, cheat_batch)
    vouchers = [r for r in swarm.runners if r.records.get(target + 1) is not None
                and r.records[target + 1].witness_sent]
    assert len(vouchers) == 1 and state.progress.step >= target + 3
    honest = [n for n in swarm.nodes if n != cheat]
    if vouchers[0].me != cheat:
        applied = [dict(swarm.worker(n).applied)[target + 2] for n in swarm.nodes]
        assert applied[0] == applied[1] == applied[2] and len(applied[0]) == 2
        assert cheat_payload not in applied[0]
        assert [e.skipped for e in swarm.events_of(Applied) if e.of_step == target] == [1, 1, 1]
    else:
        for n in honest:
            assert target + 2 not in dict(swarm.worker(n).applied)
            assert any(f"step {target}: consensus results" in e.reason
                       for e in swarm.events_of(Desynced, n))


async def test_announcements_from_a_client_not_assigned_the_batch_are_ignored() -> None:
    swarm = FakeSwarm(3)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.RoundTrain)
    victim, intruder = swarm.runners[0], swarm.nodes[1]
    step = swarm.coordinator.state.progress.step
    record = victim.records[step]
    foreign = next(b for b, n in record.assignments.items() if n != intruder)
    before = victim.counters.apply_message_ignored
    victim.on_broadcast(intruder.key, ResultAnnouncement(
        step=step, batch_id=BatchId(start=foreign[0], end=foreign[1]),
        commitment=b"\x01" * 32, blob_hash=b"\x02" * 32, blob_size=10))
    assert victim.counters.apply_message_ignored == before + 1
    assert b"\x01" * 32 not in record.announced.get(foreign, {})
    # A gossip message for a step far outside the current window is dropped too.
    victim.on_broadcast(intruder.key, Finished(step=step + 50))
    assert victim.counters.apply_message_ignored == before + 2 and step + 50 not in victim.early


async def test_gossip_ahead_of_its_round_waits_for_it() -> None:
    swarm = FakeSwarm(3)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.RoundTrain)
    runner, other = swarm.runners[0], swarm.nodes[1]
    step = swarm.coordinator.state.progress.step
    runner.on_broadcast(other.key, Finished(step=step + 1))
    assert [m for _, m in runner.early[step + 1]] == [Finished(step=step + 1)]
    await swarm.run_until(step_reached(step + 1))
    assert other.key in runner.records[step + 1].finished_from
    assert step + 1 not in runner.early


async def test_a_runner_that_missed_a_round_desyncs_and_stops_training() -> None:
    # Three witnesses (quorum 2) among four: the run goes on without the deaf runner.
    swarm = FakeSwarm(4, min_clients=3, witness_nodes=3)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.RoundTrain)
    start = swarm.coordinator.state.progress.step
    deaf = swarm.nodes[2]
    swarm.deaf.add(deaf)  # hears nothing of round start+1
    await swarm.run_until(step_reached(start + 2))
    swarm.deaf.clear()
    swarm.publish()
    await swarm.settle()
    assert [e.reason for e in swarm.events_of(Desynced, deaf)] == [
        f"missed the round before step {start + 2}"]
    assert [s for s, _ in swarm.worker(deaf).trained if s > start] == []
    assert swarm.runner(deaf).desynced and not swarm.runner(deaf).model_fresh


async def test_a_silent_trainer_is_dropped_by_the_witness_health_check() -> None:
    swarm = FakeSwarm(3, max_round_train_time=3)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.RoundTrain
                          and s.coordinator.state.current_round.height >= 1)
    state = swarm.coordinator.state
    silent = next(n for n in swarm.nodes if not elected(state, n))
    swarm.peers(silent).silent = True
    await swarm.run_until(lambda s: health_of(s, silent) is not ClientState.Healthy,
                          max_turns=300)
    checks = [(who, message, result) for who, message, result in swarm.sent
              if isinstance(message, HealthCheck)]
    assert checks, "no health check was sent"
    accepted = [message for _, message, result in checks if result is None]
    assert accepted and all(node == silent for m in accepted for node, _ in m.checks)
    assert any(silent.key.hex()[:12] in e.unhealthy for e in swarm.events_of(HealthCheckSent))


async def test_a_runner_left_out_of_a_round_reloads_the_model_at_the_next_epoch() -> None:
    """Dropped mid-epoch but still connected, a runner misses the applies of the epoch's
    later rounds: keeping its model for the next epoch would diverge from every peer (a
    chaos run's two final checkpoints differed). It must load the model instead."""
    swarm = FakeSwarm(3, epoch_time=30, warmup_time=5, max_round_train_time=3,
                      min_clients=2, total_steps=60)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.RoundTrain
                          and s.coordinator.state.current_round.height >= 1)
    state = swarm.coordinator.state
    silent = next(n for n in swarm.nodes if not elected(state, n))
    runner = next(r for r in swarm.runners if r.me == silent)
    assert runner.model_fresh
    swarm.peers(silent).silent = True
    await swarm.run_until(lambda s: s.coordinator.state.run_state.active
                          and s.coordinator.state.index_of(silent) is None, max_turns=300)
    await swarm.turn()
    assert not runner.model_fresh
    swarm.peers(silent).silent = False
    loads_before = len(swarm.worker(silent).loads)
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch >= 1
                          and s.coordinator.state.run_state is RunState.RoundTrain
                          and s.coordinator.state.index_of(silent) is not None, max_turns=600)
    assert len(swarm.worker(silent).loads) > loads_before  # reloaded, not kept


async def test_a_runner_never_reports_itself_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the witnesses' blooms say, a health check names only peers."""
    from client_image.runtime import consensus_apply

    swarm = FakeSwarm(3, max_round_train_time=3)
    judged: list[NodeIdentity] = []

    def everyone_unhealthy(state: CoordinatorState, expected: set[bytes]) -> list:
        proofs = []
        for node in swarm.nodes:
            proof = selection_for_round(state).committee_of(state.index_of(node) or 0)
            proofs.append((node, proof))
        judged.extend(swarm.nodes)
        return proofs

    monkeypatch.setattr(consensus_apply, "unhealthy_trainers", everyone_unhealthy)
    await swarm.run_until(lambda s: s.coordinator.state.current_round.height >= 3)
    sent = [(who, message) for who, message, _ in swarm.sent if isinstance(message, HealthCheck)]
    assert judged and sent
    assert all(node != who for who, message in sent for node, _ in message.checks)
    assert all(len(message.checks) == 2 for _, message in sent)


async def test_cooldown_checkpoints_and_shares_the_model(tmp_path: Path) -> None:
    swarm = FakeSwarm(3, checkpoint_dir=tmp_path, epoch_time=12, warmup_time=5,
                      max_round_train_time=5)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown)
    await swarm.settle()
    step = swarm.coordinator.state.progress.step - 1
    for n in swarm.nodes:
        assert swarm.worker(n).saved == [step]
        assert swarm.worker(n).rounded == 1  # to bf16 before saving, as Psyche does
        # Shared as the model of the step the next epoch starts at.
        assert swarm.peers(n).shared == [swarm.coordinator.state.progress.step]
    assert {e.path for e in swarm.events_of(Checkpointed)} == {str(tmp_path / f"local-testnet-step{step}")}
    # Next epoch: a P2P checkpoint is fetched from the peers that went through cooldown.
    assert all(r.previous_epoch_clients for r in swarm.runners)


async def test_a_batch_is_fetched_again_while_its_round_lasts() -> None:
    """The TCP data server lives in the coordinator's process: while a restarting
    coordinator holds the round, fetches fail. The runner keeps trying as long as the round
    is on, so its result is not lost; once the round is over, the failure stands."""
    swarm = FakeSwarm(3, epoch_time=30, warmup_time=5, max_round_train_time=5)
    down = swarm.nodes[0]
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.RoundWitness
                          and s.coordinator.state.current_round.height == 1)
    step = swarm.coordinator.state.progress.step + 1
    swarm.data_down.add(down)
    await swarm.run_until(lambda s: s.coordinator.state.progress.step == step)
    await asyncio.sleep(0.2)  # the coordinator is away: the round stays as it is
    assert swarm.data[down].failed > 3 and not swarm.runner(down).desynced
    swarm.data_down.discard(down)
    await swarm.run_until(lambda s: s.coordinator.state.progress.step == step + 3)
    assert step in [e.step for e in swarm.events_of(Trained, down)]
    assert [(e.results, e.skipped) for e in swarm.events_of(Applied)
            if e.of_step == step] == [(3, 0)] * 3  # everyone applied all three results
    assert not swarm.events_of(Desynced)
    # Down until the round is over: the runner gives up (and rejoins next epoch).
    swarm.data_down.add(down)
    await swarm.run_until(lambda s: swarm.runner(down).desynced)
    [desync] = swarm.events_of(Desynced, down)
    assert "DataProviderError" in desync.reason and "stand-in" in desync.reason
    assert swarm.coordinator.state.progress.step > step + 3


async def test_a_failed_save_still_shares_the_model_and_says_so(tmp_path: Path) -> None:
    """A checkpoint that cannot be written (disk full, say) loses the local copy only: the
    model is still served to the next epoch's joiners, which get it from the peers instead
    of the run falling back to its stored checkpoint."""
    swarm = FakeSwarm(3, checkpoint_dir=tmp_path, epoch_time=12, warmup_time=5,
                      max_round_train_time=5)
    broken = swarm.nodes[0]
    why = f"the checkpoint of step 9 was not written to {tmp_path}: [Errno 28] No space left"
    swarm.worker(broken).fail_saves = why
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown)
    await swarm.settle()
    start = swarm.coordinator.state.progress.step
    [failed] = swarm.events_of(CheckpointFailed, broken)
    assert (failed.step, failed.directory, failed.error) == (start - 1, str(tmp_path), why)
    assert not swarm.events_of(Checkpointed, broken) and swarm.worker(broken).saved == []
    for n in swarm.nodes:
        assert swarm.peers(n).shared == [start]  # the broken one's too
    assert not swarm.events_of(TaskFailed) and not swarm.runner(broken).desynced
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.run_state is RunState.RoundTrain)
    assert isinstance(swarm.coordinator.state.model.checkpoint, P2PCheckpoint)
    assert swarm.worker(broken).loads == ["hub:assets/tiny-llama"]  # kept its own model


async def test_a_desynced_runner_reloads_the_model_from_the_last_epochs_peers() -> None:
    # Three witnesses (quorum 2) among four: the run goes on while one runner is lost.
    swarm = FakeSwarm(4, epoch_time=12, warmup_time=5, max_round_train_time=5, min_clients=3,
                      witness_nodes=3)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.RoundTrain)
    lost = swarm.runners[0]
    worker = swarm.worker(lost.me)
    worker.fail_training = "CUDA error: an illegal memory access"
    await swarm.run_until(lambda s: lost.desynced)
    worker.fail_training = None
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.run_state is RunState.RoundTrain)
    # Epoch 0 started from the Hub; the coordinator then names the epoch's clients as the
    # source, and only the runner whose model went stale fetches it from them.
    assert isinstance(swarm.coordinator.state.model.checkpoint, P2PCheckpoint)
    assert worker.loads == ["hub:assets/tiny-llama", "p2p"]
    assert sorted(swarm.peers(lost.me).fetched_from) == sorted(n.key for n in swarm.nodes[1:])
    for other in swarm.nodes[1:]:
        assert swarm.worker(other).loads == ["hub:assets/tiny-llama"]
    assert not lost.desynced and lost.model_fresh
    assert [e.source for e in swarm.events_of(ModelLoaded, lost.me)] == ["hub", "p2p"]


async def test_a_restarted_runner_gets_the_epochs_model_from_its_peers_never_the_hub() -> None:
    """A restarted client saw no cooldown, so it cannot tell who holds the model: it asks
    every other client of the epoch for the model of the epoch's start step."""
    swarm = FakeSwarm(3, epoch_time=12, warmup_time=5, max_round_train_time=5)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown)
    await swarm.settle()
    restarted = await swarm.restart(swarm.nodes[0])
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.run_state is RunState.RoundTrain)
    state = swarm.coordinator.state
    worker, peers = swarm.worker(restarted.me), swarm.peers(restarted.me)
    assert worker.loads == ["p2p"]
    assert sorted(peers.fetched_from) == sorted(n.key for n in swarm.nodes[1:])
    assert peers.fetched_step == state.epoch_state.start_step
    assert restarted.model_fresh and not restarted.desynced
    assert [s for s, _ in worker.trained]  # it trains this epoch, on the fetched model


async def test_holders_restarted_at_once_resume_from_their_own_checkpoints(tmp_path) -> None:
    """Every runner restarted at once, but each wrote its checkpoint at the last cooldown:
    no peer serves the model, so each loads its own checkpoint of that cooldown (the
    model of the epoch's start step), serves it, and the epoch trains; nobody goes back
    to the stored model."""
    swarm = FakeSwarm(3, checkpoint_dir=tmp_path, epoch_time=12, warmup_time=5,
                      max_round_train_time=5)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown)
    await swarm.settle()
    for n in swarm.nodes:
        await swarm.restart(n)
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.run_state is RunState.RoundTrain)
    start = swarm.coordinator.state.epoch_state.start_step
    assert isinstance(swarm.coordinator.state.model.checkpoint, P2PCheckpoint)
    for n in swarm.nodes:
        loaded = swarm.events_of(ModelLoaded, n)
        assert [e.source for e in loaded] == ["hub", "local"]  # before and after the restart
        assert loaded[-1].repo.endswith(f"local-testnet-step{start - 1}")
        assert swarm.peers(n).shared == [start]  # served to whoever asks next
        # Announced while it loaded, with the size of its weights: fetchers wait for it.
        [(step, size)] = swarm.peers(n).loading
        assert step == start and size > 0
    await swarm.run_until(step_reached(start + 2))
    assert all(swarm.worker(n).trained for n in swarm.nodes)


async def test_a_restarted_holder_loads_its_own_checkpoint_before_asking_peers(
        tmp_path: Path) -> None:
    """One holder restarted while the others still serve the model: it reloads its own
    checkpoint of the last cooldown at once (the same bf16 weights) instead of first
    waiting on peers that may be restarting too, and serves it."""
    swarm = FakeSwarm(3, checkpoint_dir=tmp_path, epoch_time=12, warmup_time=5,
                      max_round_train_time=5)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown)
    await swarm.settle()
    restarted = await swarm.restart(swarm.nodes[0])
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.run_state is RunState.RoundTrain)
    start = swarm.coordinator.state.epoch_state.start_step
    peers = swarm.peers(restarted.me)
    assert [e.source for e in swarm.events_of(ModelLoaded, restarted.me)] == ["hub", "local"]
    assert peers.fetched_from == [] and peers.fetched_step is None  # no peer was asked
    assert [step for step, _ in peers.loading] == [start] and peers.shared == [start]
    await swarm.run_until(step_reached(start + 2))
    assert swarm.worker(restarted.me).trained


async def test_with_no_peer_holding_the_model_a_runner_sits_the_epoch_out() -> None:
    """Every runner restarted at once: the run's model (P2P) is held by nobody, so nobody
    may train on the stale Hub model; all of them desync instead."""
    swarm = FakeSwarm(3, epoch_time=12, warmup_time=5, max_round_train_time=5)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown)
    await swarm.settle()
    for n in swarm.nodes:
        await swarm.restart(n)
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.run_state is RunState.Warmup)
    await swarm.settle()
    assert isinstance(swarm.coordinator.state.model.checkpoint, P2PCheckpoint)
    for n in swarm.nodes:
        assert swarm.worker(n).loads == [] and swarm.worker(n).trained == []
        assert any("warmup failed" in e.reason for e in swarm.events_of(Desynced, n))


async def test_when_the_coordinator_falls_back_to_the_hub_every_runner_reloads_it() -> None:
    """A first round whose witness never reports ends the epoch with everyone withdrawn;
    the next epoch starts from the stored (Hub) checkpoint. Runners whose in-memory model
    is still fresh must load it too, or they would train on a model no other client has."""
    swarm = FakeSwarm(3, epoch_time=60)
    swarm.muted.update(swarm.nodes)  # no witness message ever arrives
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown,
                          max_turns=600)
    swarm.muted.clear()
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.run_state is RunState.RoundTrain)
    assert isinstance(swarm.coordinator.state.model.checkpoint, HubCheckpoint)
    for n in swarm.nodes:
        assert swarm.worker(n).loads == ["hub:assets/tiny-llama"] * 2
    await swarm.run_until(step_reached(swarm.coordinator.state.progress.step + 3))
    applied = [swarm.worker(n).applied for n in swarm.nodes]
    assert applied[0] == applied[1] == applied[2]


async def test_when_a_later_round_loses_its_witness_the_next_epoch_keeps_the_model() -> None:
    """The witness of a round past the first dies (here: is muted): the epoch ends, but its
    clients hold the model, so the next epoch is P2P and nobody reloads the stored one."""
    swarm = FakeSwarm(3, epoch_time=60)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.RoundTrain
                          and s.coordinator.state.current_round.height == 2)
    state = swarm.coordinator.state
    witness = next(n for n in swarm.nodes if elected(state, n))
    swarm.muted.add(witness)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown,
                          max_turns=600)
    assert state.progress.step < 10  # ended by the lost witness, not by epoch_time
    swarm.muted.clear()
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.run_state is RunState.RoundTrain)
    assert isinstance(swarm.coordinator.state.model.checkpoint, P2PCheckpoint)
    for n in swarm.nodes:
        assert swarm.worker(n).loads == ["hub:assets/tiny-llama"]
    await swarm.run_until(step_reached(swarm.coordinator.state.progress.step + 3))
    applied = [swarm.worker(n).applied for n in swarm.nodes]
    assert applied[0] == applied[1] == applied[2]


async def test_a_failing_round_task_is_a_desync_not_a_crash() -> None:
    swarm = FakeSwarm(3)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.RoundTrain)
    runner = swarm.runners[0]
    swarm.worker(runner.me).fail_training = "out of memory"
    await swarm.run_until(step_reached(swarm.coordinator.state.progress.step + 2))
    assert any("out of memory" in e.reason for e in swarm.events_of(Desynced, runner.me))
    assert [e for e in swarm.events_of(Trained, runner.me)
            if e.step > swarm.coordinator.state.progress.step] == []
