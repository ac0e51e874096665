"""Verification in the round runner, on a real coordinator: followers replay, compare,
report; the quorum ejects; every client leaves the ejected trainer's results out alike.
The workers are fakes (runner_swarm.FakeWorker), but their replay is a real recomputation
of the fake training, so an honest result matches and a cheater's does not."""

from __future__ import annotations

from runner_swarm import FakeSwarm, payload_of

from client_image.runtime.events import (
    Ejected,
    Following,
    ResultLeftOut,
    ResultVerified,
    VerificationReportSent,
)
from coordinator import ClientState, NodeIdentity, RunState
from coordinator.state import VerificationReport
from coordinator.verification import plan_for_epoch


async def test_an_honest_swarm_with_verification_verifies_every_followed_result_and_reports_none(
) -> None:
    swarm = FakeSwarm(4, verification_percent=50)
    await swarm.run_until(lambda s: s.coordinator.state.progress.step >= 10)
    state = swarm.coordinator.state
    plan = plan_for_epoch(state.epoch_state, 50)
    for n in swarm.nodes:
        assert swarm.worker(n).delta_resets == 1
        assert swarm.worker(n).following == [t.key for t in plan.followed_by(n)]
    assert all(len(fs) == 2 for fs in plan.followers.values()) and len(plan.followers) == 2
    verified = swarm.events_of(ResultVerified)
    assert len(verified) >= 4 and all(e.ok for e in verified)
    assert not swarm.events_of(VerificationReportSent)
    assert not any(isinstance(m, VerificationReport) for _, m, _ in swarm.sent)
    assert all(c.state is ClientState.Healthy for c in state.epoch_state.clients)
    applied = [swarm.worker(n).applied for n in swarm.nodes]
    assert applied[0] == applied[1] == applied[2] == applied[3] and len(applied[0]) >= 4
    assert len(swarm.events_of(Following)) == 4


async def watched_cheat(swarm: FakeSwarm) -> NodeIdentity:
    """Once the epoch's plan is known (round 0), one of the watched trainers cheats."""
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.RoundTrain)
    plan = plan_for_epoch(swarm.coordinator.state.epoch_state, 50)
    cheat = sorted(plan.followers)[0]
    swarm.worker(cheat).cheat = True
    return cheat


async def test_a_cheating_trainer_is_reported_by_its_followers_ejected_and_left_out() -> None:
    swarm = FakeSwarm(4, verification_percent=50, epoch_time=600, total_steps=60,
                      min_clients=3)
    cheat = await watched_cheat(swarm)
    await swarm.run_until(lambda s: any(
        c.id == cheat and c.state is ClientState.Ejected
        for c in s.coordinator.state.epoch_state.exited_clients))
    state = swarm.coordinator.state
    reports = [r for r in state.epoch_state.reports if r.accused == cheat]
    plan = plan_for_epoch(state.epoch_state, 50)
    assert {r.reporter for r in reports} == set(plan.followers[cheat])
    assert len(reports) == 2 and all(r.published_hash != r.expected_hash for r in reports)
    sent = swarm.events_of(VerificationReportSent)
    assert {e.accused for e in sent} == {cheat.key.hex()}
    failed = [e for e in swarm.events_of(ResultVerified) if not e.ok]
    assert failed and {e.trainer for e in failed} == {cheat.key.hex()}
    # no honest trainer is ever reported
    assert all(e.ok for e in swarm.events_of(ResultVerified) if e.trainer != cheat.key.hex())
    # from the next round on, every client leaves the cheater's in-flight results out
    ejected_at, epoch = state.progress.step, state.progress.epoch
    await swarm.run_until(lambda s: s.coordinator.state.progress.step >= ejected_at + 2)
    assert swarm.coordinator.state.progress.epoch == epoch, "the epoch ended: a longer one"
    honest = [n for n in swarm.nodes if n != cheat]
    applied = [swarm.worker(n).applied for n in honest]
    assert applied[0] == applied[1] == applied[2]
    cheats = {payload_of(b"not the batch", s, b) for s, b in swarm.worker(cheat).trained}
    later = [payloads for step, payloads in applied[0] if step >= ejected_at]
    assert later and not any(set(p) & cheats for p in later), [
        (step, len(p), bool(set(p) & cheats)) for step, p in applied[0]]
    left = [e for n, e in swarm.events if isinstance(e, ResultLeftOut) and e.check == "ejected"]
    assert {e.trainer for e in left} <= {cheat.key.hex()}
    told = swarm.events_of(Ejected, cheat)
    assert told and set(told[0].reporters) == {r.reporter.key.hex() for r in reports}


async def test_an_ejected_client_earns_nothing_for_the_epoch_and_is_slashed() -> None:
    swarm = FakeSwarm(4, verification_percent=50, total_steps=60,
                      min_clients=3)
    swarm.coordinator.state.rewards.future_earning_rate_total_shared = 400
    swarm.coordinator.state.rewards.future_slashing_rate_per_client = 7
    cheat = await watched_cheat(swarm)
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch >= 1
                          and s.coordinator.state.run_state is not RunState.Cooldown,
                          max_turns=2000)
    entries = {e.id: e for e in swarm.coordinator.state.rewards.entries}
    assert entries[cheat].earned == 0 and entries[cheat].slashed == 7
    assert all(entries[n].earned > 0 and entries[n].slashed == 0
               for n in swarm.nodes if n != cheat)
