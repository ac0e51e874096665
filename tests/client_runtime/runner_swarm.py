"""An in-memory swarm of round runners around a real `Coordinator`: no network, no torch model.

What is real: the coordinator (state machine, elections, data assignment, witness and
health-check rules), the state encoding each runner receives, the runners themselves,
their records, blooms and consensus. What is fake (named so): the coordinator link
(messages go straight to the coordinator, as the TCP server would apply them), the peers
(gossip and blobs in dictionaries, with knobs to drop or corrupt), the worker (a payload
per (trainer, step, batch), an apply log) and the data.

    swarm = FakeSwarm(3)
    await swarm.run_until(lambda s: s.coordinator.state.progress.step >= 6)
    swarm.runners[0].worker.applied   # [(step, [payload, ...]), ...]
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from client_image.data import DataProviderError
from client_image.p2p import Finished, ResultAnnouncement
from client_image.runtime.events import RuntimeEvent
from client_image.runtime.model_keeper import CheckpointOptions
from client_image.runtime.observability import EventLog
from client_image.runtime.ports import Broadcast, FetchedModel, ModelUnavailable
from client_image.runtime.round_runner import RoundRunner, RunnerOptions
from client_image.training import TrainStepOutput
from client_image.training.checkpoint import CheckpointError
from client_image.verification.followers import Checked
from client_image.verification.replay import Verdict
from client_image.verification.similarity import Distances
from coordinator import (
    ClientState,
    Coordinator,
    CoordinatorState,
    NodeIdentity,
    RunState,
    decode_state,
    encode_state,
)
from coordinator.config import LLMConfig, state_file_from_dict
from coordinator.messages import (
    CheckpointReport,
    HealthCheck,
    RoundWitness,
    WarmupWitness,
)
from coordinator.state import VerificationReport

# What a runner tells the coordinator through its typed port (coordinator.messages).
Message = RoundWitness | WarmupWitness | HealthCheck | CheckpointReport | VerificationReport

LOCAL_TESTNET = Path(__file__).resolve().parents[2] / "config" / "local-testnet" / "state.toml"


def node(i: int) -> NodeIdentity:
    return NodeIdentity(hashlib.sha256(b"runner" + bytes([i])).digest())


def payload_of(trainer: bytes, step: int, batch: tuple[int, int]) -> bytes:
    return b"result:" + hashlib.sha256(trainer + repr((step, batch)).encode()).digest()


class FakeWorker:
    """Trains instantly: the result is a hash of (trainer, step, batch); logs every apply."""

    def __init__(self, me: NodeIdentity):
        self.me = me
        self.loaded = False
        self.loads: list[str] = []
        self.trained: list[tuple[int, tuple[int, int]]] = []
        self.applied: list[tuple[int, list[bytes]]] = []
        self.idled: list[int] = []  # steps others trained and this client had no batch
        self.left_out: set[bytes] = set()  # senders whose results screen() leaves out
        self.screened: list[tuple[int, list[bytes], dict[bytes, bytes]]] = []
        self.saved: list[int] = []
        self.rounded = 0  # round_to_bf16 calls (one per cooldown)
        self.fail_training: str | None = None  # train raises RuntimeError(this) while set
        # save_checkpoint raises CheckpointError(this) while set, as the real one does
        # when its write fails (tests/training/test_checkpoint_and_model.py)
        self.fail_saves: str | None = None
        # verification: a cheater publishes results no replay reproduces
        self.cheat = False
        self.delta_resets = 0
        self.following: list[bytes] = []
        self.replayed: dict[tuple[bytes, int], bytes] = {}  # (trainer, step) -> expected
        self.verified: list[tuple[bytes, int, bool]] = []

    async def load_from_hub(self, repo_id: str, revision: str | None, llm: LLMConfig,
                            start_step: int) -> None:
        self.loaded = True
        self.loads.append(f"hub:{repo_id}")

    async def load_from_peers(self, config_json: str, tokenizer_json: str | None,
                              state_dict: dict[str, torch.Tensor], llm: LLMConfig,
                              start_step: int) -> None:
        self.loaded = True
        self.loads.append("p2p")

    async def train(self, step: int, batch: torch.Tensor, batch_id: tuple[int, int],
                    cold_start: bool) -> TrainStepOutput:
        if self.fail_training is not None:
            raise RuntimeError(self.fail_training)
        self.trained.append((step, batch_id))
        payload = payload_of(self.me.key, step, batch_id)
        if self.cheat:
            payload = payload_of(b"not the batch", step, batch_id)
        return TrainStepOutput(step=step, loss=1.0 / step, payload=payload, grad_norm=0.0)

    async def reset_delta(self) -> None:
        self.delta_resets += 1

    async def follow(self, trainers: Sequence[bytes], start_step: int,
                     joined_classes: Mapping[bytes, int] | None = None) -> bool:
        self.following = list(trainers)
        return True

    async def replay(self, trainer: bytes, step: int, batch: torch.Tensor,
                     batch_id: tuple[int, int], cold_start: bool) -> None:
        """What an honest (fake) trainer publishes: a real replay of the fake training."""
        if trainer in self.following:
            self.replayed[(trainer, step)] = payload_of(trainer, step, batch_id)

    async def verify(self, trainer: bytes, step: int, published: bytes) -> Checked | None:
        expected = self.replayed.pop((trainer, step), None)
        if expected is None:
            return None
        ok = expected == published
        self.verified.append((trainer, step, ok))
        distance = 0.0 if ok else 1.0
        return Checked(Verdict(ok, Distances(distance, distance, distance),
                               "" if ok else "jaccard 1.0000 > 0.0200"),
                       hashlib.sha256(published).digest(), hashlib.sha256(expected).digest())

    async def decode(self, payload: bytes) -> object:
        if not payload.startswith(b"result:"):
            raise ValueError("not a result")
        return payload

    async def apply(self, step: int, payloads: Sequence[bytes]) -> int:
        self.applied.append((step, list(payloads)))
        return len(payloads)

    async def idle(self, step: int) -> None:
        self.idled.append(step)

    async def screen(self, of_step: int, results: Sequence[tuple[bytes, bytes]],
                     previous: Mapping[bytes, bytes]) -> dict[int, tuple[str, str]]:
        """Leaves out the results of the senders in `left_out` (the real checks need real
        results: tests/training/test_verification.py)."""
        self.screened.append((of_step, [sender for sender, _ in results], dict(previous)))
        return {i: ("copy", "fake check") for i, (sender, _) in enumerate(results)
                if sender in self.left_out}

    async def round_to_bf16(self) -> None:
        self.rounded += 1

    async def save_checkpoint(self, checkpoint_dir: Path, run_id: str, step: int,
                              keep_steps: int) -> Path:
        from safetensors.torch import save_file

        if self.fail_saves is not None:
            raise CheckpointError(self.fail_saves)
        self.saved.append(step)
        path = checkpoint_dir / f"{run_id}-step{step}"
        path.mkdir(parents=True, exist_ok=True)
        save_file({"w": torch.zeros(2)}, str(path / "model.safetensors"))
        (path / "config.json").write_text("{}")
        return path

    async def sharing_payload(self) -> tuple[dict[str, torch.Tensor], str, str | None]:
        return {"w": torch.zeros(2)}, "{}", None


class FakeData:
    """Serves zeros; raises DataProviderError, as a data server that is down does, while
    its runner is in `swarm.data_down`."""

    def __init__(self, swarm: FakeSwarm | None = None, me: NodeIdentity | None = None):
        self.swarm, self.me = swarm, me
        self.failed = 0

    async def fetch(self, start: int, end: int) -> torch.Tensor:
        if self.swarm is not None and self.me in self.swarm.data_down:
            self.failed += 1
            raise DataProviderError("data server 127.0.0.1:9: fetch failed (stand-in)")
        return torch.zeros((end - start + 1, 8), dtype=torch.int64)


class FakePeers:
    """Gossip and blobs of one runner inside the swarm's dictionaries."""

    def __init__(self, swarm: FakeSwarm, me: NodeIdentity):
        self.swarm = swarm
        self.me = me
        self.silent = False  # drop everything this runner gossips
        self.shared: list[int] = []  # the steps of the models shared
        self.loading: list[tuple[int, int]] = []  # the models announced as loading
        self.fetched_from: list[bytes] = []
        self.fetched_step: int | None = None

    async def broadcast(self, message: Broadcast) -> None:
        self.swarm.gossip.append((self.me.key, message))
        if self.silent:
            return
        loop = asyncio.get_running_loop()
        for runner in self.swarm.runners:
            if runner.me != self.me:
                loop.call_soon(runner.on_broadcast, self.me.key, message)

    def publish_result(self, step: int, payload: bytes) -> bytes:
        blob_hash = hashlib.sha256(payload).digest()
        self.swarm.blobs[blob_hash] = payload
        self.swarm.blob_steps[blob_hash] = step
        return blob_hash

    async def download_result(self, blob_hash: bytes, size: int, sender: bytes, step: int,
                              also_from: Sequence[bytes] = ()) -> bytes:
        await asyncio.sleep(0)
        data = self.swarm.blobs[blob_hash]
        step = self.swarm.blob_steps[blob_hash]
        return self.swarm.corrupt_results_of.get((sender, step), lambda same: same)(data)

    def forget_results_before(self, step: int) -> None:
        return None

    async def fetch_model(self, sources: Sequence[bytes], step: int) -> FetchedModel:
        """Served only by a runner that shared the model of exactly `step`."""
        self.fetched_from, self.fetched_step = list(sources), step
        holders = [s for s in sources if step in self.swarm.peers_of(s).shared]
        if not holders:
            raise ModelUnavailable(f"no source shares the model of step {step}")
        return FetchedModel("{}", None, {"w": torch.zeros(2)}, peers=len(holders), bytes=8)

    def share_model(self, weights: dict[str, torch.Tensor], config_json: str,
                    tokenizer_json: str | None, step: int) -> None:
        self.shared.append(step)

    def announce_loading(self, step: int, total_bytes: int) -> None:
        self.loading.append((step, total_bytes))


class FakeCoordinatorLink:
    """Queues a runner's messages for the swarm's coordinator (applied one per turn, as the
    TCP server would apply them between ticks)."""

    def __init__(self, swarm: FakeSwarm, me: NodeIdentity):
        self.swarm = swarm
        self.me = me
        self.withdrawn = False

    def _queue(self, message: Message) -> bool:
        if self.me not in self.swarm.muted:
            self.swarm.inbox.append((self.me, message))
        return True

    async def send_witness(self, witness: RoundWitness) -> bool:
        return self._queue(witness)

    async def send_warmup_witness(self, witness: WarmupWitness) -> bool:
        return self._queue(witness)

    async def send_health_check(self, check: HealthCheck) -> bool:
        return self._queue(check)

    async def report_checkpoint(self, report: CheckpointReport) -> bool:
        return self._queue(report)

    async def report_verification(self, report: VerificationReport) -> bool:
        return self._queue(report)

    async def withdraw(self) -> bool:
        self.withdrawn = True
        return True


class FakeSwarm:
    def __init__(self, clients: int, *, apply_download_timeout_s: float = 0.3,
                 checkpoint_dir: Path | None = None, model: dict[str, Any] | None = None,
                 hub_repo: str | None = None, checkpoints: CheckpointOptions | None = None,
                 **config: Any):
        data = tomllib.loads(LOCAL_TESTNET.read_text())
        data["config"].update({"min_clients": clients, "init_min_clients": clients,
                               "global_batch_size_start": 4 * clients,
                               "global_batch_size_end": 4 * clients, **config})
        data["model"]["LLM"].update(model or {})
        self.coordinator = Coordinator.from_state_file(state_file_from_dict(data))
        self.now = 1_000
        self.gossip: list[tuple[bytes, Broadcast]] = []
        self.blobs: dict[bytes, bytes] = {}
        self.blob_steps: dict[bytes, int] = {}
        # (trainer, step) -> what its result turns into on the way to everyone else
        self.corrupt_results_of: dict[tuple[bytes, int], Callable[[bytes], bytes]] = {}
        self.deaf: set[NodeIdentity] = set()  # runners that hear no coordinator state
        self.muted: set[NodeIdentity] = set()  # runners whose messages never arrive
        self.data_down: set[NodeIdentity] = set()  # runners whose data fetches fail
        self.data: dict[NodeIdentity, FakeData] = {}
        self.inbox: list[tuple[NodeIdentity, Message]] = []
        self.sent: list[tuple[NodeIdentity, Message, object]] = []  # with the coordinator's answer
        self.events: list[tuple[NodeIdentity, RuntimeEvent]] = []
        self.nodes = [node(i) for i in range(clients)]
        checkpoints = checkpoints or CheckpointOptions(checkpoint_dir=checkpoint_dir,
                                                       hub_repo=hub_repo)
        self.runners = [self._runner(me, apply_download_timeout_s, checkpoints)
                        for me in self.nodes]
        self._published: dict[NodeIdentity, bytes] = {}

    def _runner(self, me: NodeIdentity, timeout_s: float, checkpoints: CheckpointOptions
                ) -> RoundRunner:
        events = EventLog("none")
        events.listeners.append(lambda event: self.events.append((me, event)))

        async def open_data(state: CoordinatorState) -> FakeData:
            return self.data.setdefault(me, FakeData(self, me))

        return RoundRunner(
            me, backend=FakeCoordinatorLink(self, me), peers=FakePeers(self, me),
            worker=FakeWorker(me), open_data=open_data, events=events,
            options=RunnerOptions(apply_download_timeout_s=timeout_s, data_retry_delay_s=0.01,
                                  checkpoints=checkpoints))

    # ------------------------------------------------------------------ driving
    def seed(self) -> int:
        return int.from_bytes(hashlib.sha256(self.now.to_bytes(8, "little")).digest()[:8],
                              "little")

    def runner(self, who: NodeIdentity) -> RoundRunner:
        return next(r for r in self.runners if r.me == who)

    def worker(self, who: NodeIdentity) -> FakeWorker:
        worker = self.runner(who).worker
        assert isinstance(worker, FakeWorker)
        return worker

    def peers_of(self, key: bytes) -> FakePeers:
        return self.peers(next(n for n in self.nodes if n.key == key))

    async def restart(self, who: NodeIdentity) -> RoundRunner:
        """A fresh runner for `who`: it remembers nothing (no model, no last cooldown)."""
        index = next(i for i, r in enumerate(self.runners) if r.me == who)
        old = self.runners[index]
        await old.close()
        fresh = self._runner(who, old.options.apply_download_timeout_s, old.options.checkpoints)
        self.runners[index] = fresh
        return fresh

    def peers(self, who: NodeIdentity) -> FakePeers:
        peers = self.runner(who).peers
        assert isinstance(peers, FakePeers)
        return peers

    def publish(self) -> None:
        """Deliver the coordinator's state to every runner whose phase/epoch/step changed
        (the client's filter); each gets its own decoded copy, as over the wire."""
        encoded = encode_state(self.coordinator.state)
        for runner in self.runners:
            if runner.me in self.deaf:
                continue
            previous = runner.state
            state = decode_state(encoded)
            if previous is not None and (previous.run_state, previous.progress.step,
                                         previous.progress.epoch) == (
                    state.run_state, state.progress.step, state.progress.epoch):
                continue
            runner.on_state(state, previous)

    async def settle(self, rounds: int = 200) -> None:
        """Let every task run until nothing is left to do (bounded)."""
        for _ in range(rounds):
            await asyncio.sleep(0)
            if not any(r.tasks.tasks for r in self.runners):
                for _ in range(5):  # call_soon deliveries may start new tasks
                    await asyncio.sleep(0)
                if not any(r.tasks.tasks for r in self.runners):
                    return
        await asyncio.sleep(0.01)

    def apply(self, sender: NodeIdentity, message: Message) -> None:
        coordinator = self.coordinator
        result: object = None
        message = copy.deepcopy(message)  # the coordinator's own copy, as over the wire
        if isinstance(message, WarmupWitness):
            result = coordinator.warmup_witness(sender, message.witness, self.now, self.seed())
        elif isinstance(message, RoundWitness):
            result = coordinator.witness(sender, message.witness, self.now)
        elif isinstance(message, HealthCheck):
            result = coordinator.health_check(sender, list(message.checks))
        elif isinstance(message, VerificationReport):
            assert message.reporter == sender
            result = coordinator.verification_report(sender, message)
        elif isinstance(message, CheckpointReport):
            result = coordinator.checkpoint(sender, message.index, message.repo)
        self.sent.append((sender, message, result))

    def pending(self) -> list[NodeIdentity]:
        """Every runner is connected and asks to take part; as the TCP server does, those
        dropped or ejected this epoch sit the next one out unless the run needs them."""
        state = self.coordinator.state
        removed = {c.id for c in state.epoch_state.exited_clients
                   if c.state in (ClientState.Dropped, ClientState.Ejected)}
        preferred = [n for n in self.nodes if n not in removed]
        if (state.run_state is RunState.WaitingForMembers
                and len(preferred) < state.config.init_min_clients):
            return list(self.nodes)
        return preferred

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (real time, bounded) for tasks that sleep, such as an apply's download wait."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while any(r.tasks.tasks for r in self.runners):
            assert asyncio.get_running_loop().time() < deadline, "runner tasks never ended"
            await asyncio.sleep(0.02)

    async def tick(self, seconds: int = 1) -> None:
        self.now += seconds
        self.coordinator.tick(self.pending(), self.now, self.seed())
        self.publish()
        await self.settle()

    async def turn(self) -> None:
        """The server's next move: one queued message if any, else a one-second tick."""
        if self.inbox:
            self.apply(*self.inbox.pop(0))
            self.publish()
            await self.settle()
        else:
            await self.tick()

    async def run_until(self, done: Callable[[FakeSwarm], bool], max_turns: int = 600) -> None:
        """Take turns until `done` (checked after every message and tick)."""
        await self.tick(0)
        for _ in range(max_turns):
            if done(self):
                return
            await self.turn()
        raise AssertionError(f"not reached in {max_turns} turns: {self.coordinator.state.run_state}"
                             f" step {self.coordinator.state.progress.step}")

    # ------------------------------------------------------------------ reading
    def events_of(self, kind: type[RuntimeEvent], who: NodeIdentity | None = None
                  ) -> list[Any]:
        return [e for n, e in self.events if isinstance(e, kind) and (who is None or n == who)]

    def finished_steps(self, who: NodeIdentity) -> list[int]:
        return [m.step for s, m in self.gossip
                if s == who.key and isinstance(m, Finished) and not m.warmup]

    def announcements(self, step: int) -> dict[tuple[int, int], ResultAnnouncement]:
        return {(m.batch_id.start, m.batch_id.end): m for _, m in self.gossip
                if isinstance(m, ResultAnnouncement) and m.step == step}
