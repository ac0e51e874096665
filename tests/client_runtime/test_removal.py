"""A client taken out of an epoch is told why: the real coordinator produces each kind of
removal, and the client's RemovalWatch infers the reason from the state it sees (and its
own training time), once per epoch; the counters, the metrics JSON, the telemetry counter
and the Training panel's text carry it."""

from __future__ import annotations

from client_image.runtime.events import Removed, RuntimeEvent, Trained
from client_image.runtime.observability import Counters, EventLog, snapshot
from client_image.runtime.removal import RemovalWatch
from coordinator import (
    Bloom,
    ClientState,
    Coordinator,
    CoordinatorState,
    NodeIdentity,
    RunState,
    Witness,
    participant_item,
    selection_for_round,
)
from psyche_common.metrics_schema import REMOVAL_REASONS, ClientMetrics
from psyche_common.ui.view import describe_training
from tests.coordinator.coordinator_sim import node, seed_at, state_file

TRAIN_S = 5  # the run's max_round_train_time


def make() -> Coordinator:
    return Coordinator.from_state_file(state_file(
        min_clients=2, init_min_clients=2, witness_nodes=2, warmup_time=10,
        max_round_train_time=TRAIN_S, round_witness_time=2, epoch_time=1000, cooldown_time=3))


def to_round_train(coordinator: Coordinator) -> int:
    now = 100
    coordinator.tick([node(i) for i in range(4)], now, 1)
    now += coordinator.state.config.warmup_time
    coordinator.tick([], now, 77)
    assert coordinator.state.run_state is RunState.RoundTrain
    return now


def finish_round(coordinator: Coordinator, now: int, vouched: list[int]) -> int:
    """Every elected witness vouches for the clients `vouched`; the round ends."""
    state = coordinator.state
    for index in selection_for_round(state).witness_indices():
        bloom = Bloom(keys=tuple(range(8)))
        for i in vouched:
            bloom.add(participant_item(state.epoch_state.clients[i].id.key))
        proof = selection_for_round(state).witness_of(index)
        assert coordinator.witness(state.epoch_state.clients[index].id,
                                   Witness(proof, participant_bloom=bloom), now) is None
    now += state.config.round_witness_time
    coordinator.tick([], now, seed_at(now))
    return now


class Watched:
    """One client's RemovalWatch over a real EventLog, and what it emitted."""

    def __init__(self, me: NodeIdentity) -> None:
        self.events = EventLog("none")
        self.counters = Counters()
        self.events.listeners.append(self.counters.observe)
        self.seen: list[RuntimeEvent] = []
        self.events.listeners.append(self.seen.append)
        self.watch = RemovalWatch(me, self.events)

    def removed(self) -> list[Removed]:
        return [e for e in self.seen if isinstance(e, Removed)]

    def see(self, state: CoordinatorState) -> None:
        self.watch.notice(state)


def trained(seconds: float) -> Trained:
    return Trained(step=1, epoch=0, loss=3.0, batch=(0, 1), payload_bytes=1, seconds=seconds,
                   tokens=1)


def dropped_by_health_check(client_train_s: float) -> tuple[Watched, Coordinator]:
    coordinator = make()
    now = to_round_train(coordinator)
    state = coordinator.state
    victim = state.epoch_state.clients[3].id
    watched = Watched(victim)
    watched.events.emit(trained(client_train_s))
    now = finish_round(coordinator, now + 1, [0, 1, 2, 3])
    now = finish_round(coordinator, now + 1, [0, 1, 2])  # client 3's result never arrived
    watched.see(state)
    assert watched.removed() == []  # still healthy until someone checks
    previous = state.previous_round
    assert previous is not None
    proof = selection_for_round(state, previous).committee_of(3)
    assert coordinator.health_check(state.epoch_state.clients[0].id, [(victim, proof)]) is None
    watched.see(state)
    finish_round(coordinator, now + 1, [0, 1, 2])  # moved to exited_clients
    watched.see(state)
    return watched, coordinator


def test_a_health_check_drop_is_told_once() -> None:
    watched, coordinator = dropped_by_health_check(client_train_s=1.0)
    [removed] = watched.removed()
    assert removed.reason == "health-check"
    assert "did not receive its result" in removed.detail
    assert removed.epoch == coordinator.state.progress.epoch
    assert watched.counters.removals == {"health-check": 1}


def test_a_drop_after_training_longer_than_the_round_is_training_over_time() -> None:
    watched, _ = dropped_by_health_check(client_train_s=TRAIN_S + 2.5)
    [removed] = watched.removed()
    assert removed.reason == "training-over-time"
    assert f"took {TRAIN_S + 2.5:.1f} s, over the round's {TRAIN_S} s" in removed.detail


def test_no_witness_in_the_first_round_is_a_late_witness_for_everyone() -> None:
    coordinator = make()
    now = to_round_train(coordinator)
    state = coordinator.state
    witness_index = selection_for_round(state).witness_indices()[0]
    others = [i for i in range(4) if i not in selection_for_round(state).witness_indices()]
    as_witness = Watched(state.epoch_state.clients[witness_index].id)
    as_trainer = Watched(state.epoch_state.clients[others[0]].id)
    coordinator.tick([], now + TRAIN_S, 1)  # training time over: RoundWitness
    coordinator.tick([], now + TRAIN_S + 2, 1)  # no witness arrived: everyone withdrawn
    assert state.run_state is RunState.Cooldown
    for watched in (as_witness, as_trainer):
        watched.see(state)
        # through the cooldown's end and the next WaitingForMembers: still one event
        coordinator.tick([], now + TRAIN_S + 2 + state.config.cooldown_time, 1)
        watched.see(state)
    assert state.run_state is RunState.WaitingForMembers
    [told_witness], [told_trainer] = as_witness.removed(), as_trainer.removed()
    assert told_witness.reason == told_trainer.reason == "late-witness"
    assert "this client was one of that round's witnesses" in told_witness.detail
    assert "this client was one" not in told_trainer.detail


def test_a_pause_and_a_withdrawal_are_told_apart() -> None:
    coordinator = make()
    now = to_round_train(coordinator)
    state = coordinator.state
    leaver, stayer = Watched(state.epoch_state.clients[1].id), Watched(
        state.epoch_state.clients[2].id)
    assert coordinator.withdraw(1) is None
    leaver.see(state)
    stayer.see(state)
    assert [r.reason for r in leaver.removed()] == ["withdrawn"]
    assert stayer.removed() == []
    assert coordinator.pause(now + 1) is None  # active: paused at the epoch's end
    now = finish_round(coordinator, now + 1, [0, 2, 3])  # the pause ends the epoch
    assert state.run_state is RunState.Cooldown
    stayer.see(state)
    assert stayer.removed() == []  # still healthy through the cooldown
    coordinator.tick([], now + state.config.cooldown_time, 1)
    assert state.run_state is RunState.Paused
    stayer.see(state)
    leaver.see(state)
    assert [r.reason for r in stayer.removed()] == ["paused"]
    assert [r.reason for r in leaver.removed()] == ["withdrawn"]  # told once, at the time


def test_the_removal_reaches_the_metrics_json_and_the_training_panel() -> None:
    watched, coordinator = dropped_by_health_check(client_train_s=1.0)
    counters = watched.counters
    counters.epoch = coordinator.state.progress.epoch
    served = ClientMetrics.model_validate_json(
        snapshot(counters, "0.1.0", None).model_dump_json())
    assert served.removals == {"health-check": 1}
    assert served.removal is not None and served.removal.reason == "health-check"
    lines = describe_training(served)
    assert any(line.startswith(f"taken out in epoch {served.removal.epoch}") and
               "(health-check): a health check dropped it" in line for line in lines)
    # two epochs later, with no new removal, the line has served its purpose
    later = served.model_copy(update={"epoch": served.removal.epoch + 2})
    assert not any("taken out" in line for line in describe_training(later))
    assert set(REMOVAL_REASONS) == {"late-witness", "training-over-time", "health-check",
                                    "paused", "withdrawn"}


def test_a_healthy_client_is_never_told_anything() -> None:
    coordinator = make()
    now = to_round_train(coordinator)
    state = coordinator.state
    watched = Watched(state.epoch_state.clients[0].id)
    for _ in range(3):
        now = finish_round(coordinator, now + 1, [0, 1, 2, 3])
        watched.see(state)
    assert watched.removed() == []
    assert all(c.state is ClientState.Healthy for c in state.epoch_state.clients)


def test_the_telemetry_counts_removals_by_reason() -> None:
    from client_image.telemetry import ClientTelemetry
    from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions
    from tests.client_runtime.standin_client import StandInClient

    client = StandInClient()
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("client", "me", "run"))
    try:
        ClientTelemetry(telemetry, client)  # type: ignore[arg-type]  # a stand-in client
        client.events.emit(Removed(2, 17, "health-check", "dropped"))
        client.events.emit(Removed(3, 30, "late-witness", "no witness"))
        client.events.emit(Removed(5, 50, "health-check", "dropped"))
        text = httpx_get_metrics(telemetry)
    finally:
        telemetry.shutdown()
    assert 'psyche_client_removed_total{' in text
    assert _sample(text, 'reason="health-check"') == 2.0
    assert _sample(text, 'reason="late-witness"') == 1.0


def httpx_get_metrics(telemetry: object) -> str:
    import httpx

    port = telemetry.prometheus.port  # type: ignore[attr-defined]  # a started Telemetry
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def _sample(text: str, label: str) -> float:
    [line] = [line for line in text.splitlines()
              if line.startswith("psyche_client_removed_total{") and label in line]
    return float(line.rsplit(" ", 1)[1])


async def test_both_tuis_tell_the_removal() -> None:
    from textual.widgets import Static

    from client_image.runtime.tui import ClientApp
    from psyche_common.metrics_schema import Removal
    from run_manager.tui.app import RunManagerApp
    from run_manager.tui.messages import DashboardChanged
    from run_manager.view import Dashboard
    from tests.client_runtime.standin_client import StandInClient

    client = StandInClient(counters=Counters(epoch=2))
    client.events.listeners.append(client.counters.observe)  # as PsycheClient wires them
    app = ClientApp(client, refresh_s=0.05)  # type: ignore[arg-type]  # a stand-in client
    async with app.run_test(size=(140, 40)) as pilot:
        client.events.emit(Removed(2, 17, "training-over-time", "its last step took 9.0 s"))
        await pilot.pause(0.2)
        summary = str(app.query_one("#training-summary", Static).render())
        assert "taken out in epoch 2 at step 17 (training-over-time): its last step" in summary
        [notice] = list(app._notifications)
        assert notice.severity == "warning" and "training-over-time" in notice.title
        await pilot.press("q")

    dashboard = Dashboard()
    removal = Removal(epoch=4, step=40, reason="late-witness", detail="no witness arrived")
    dashboard.apply_metrics(ClientMetrics(epoch=4, removal=removal))
    manager = RunManagerApp(dashboard)
    async with manager.run_test(size=(120, 40)) as pilot:
        manager.post_message(DashboardChanged("training"))
        manager.post_message(DashboardChanged("training"))  # the same removal: told once
        await pilot.pause()
        summary = str(manager.query_one("#training-summary", Static).render())
        assert "taken out in epoch 4 at step 40 (late-witness): no witness arrived" in summary
        [notice] = list(manager._notifications)
        assert "late-witness" in notice.title and "no witness arrived" in notice.message
