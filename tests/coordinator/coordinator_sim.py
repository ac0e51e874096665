"""Virtual clients driving a real Coordinator: the test harness for whole runs."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any

from coordinator import (
    Bloom,
    Coordinator,
    NodeIdentity,
    RunState,
    Witness,
    WitnessProof,
    participant_item,
    selection_for_round,
)
from coordinator.config import StateFile, state_file_from_dict

DEV_STATE = Path(__file__).resolve().parents[2] / "config" / "llama2-20m-dev" / "state.toml"


def dev_dict() -> dict[str, Any]:
    """The llama2-20m-dev state file as a fresh dict, to edit before validating."""
    return tomllib.loads(DEV_STATE.read_text())


def state_file(**config: Any) -> StateFile:
    data = dev_dict()
    model = config.pop("model", {})
    top = {k: config.pop(k) for k in ("run_state", "progress") if k in config}
    data["config"].update(config)
    data["model"]["LLM"].update(model)
    data.update(top)
    return state_file_from_dict(data)


def node(i: int) -> NodeIdentity:
    return NodeIdentity(hashlib.sha256(b"node" + i.to_bytes(4, "little")).digest())


def seed_at(now: int) -> int:
    return int.from_bytes(hashlib.sha256(now.to_bytes(8, "little")).digest()[:8], "little")


class VirtualRun:
    """Clients that join, warm up, witness perfectly, and can drop out."""

    def __init__(self, coordinator: Coordinator, clients: int, now: int = 1000):
        self.coordinator = coordinator
        self.alive = [node(i) for i in range(clients)]
        self.now = now
        self.steps_seen: list[int] = []

    def add(self, index: int) -> None:
        self.alive.append(node(index))

    def drop(self, who: NodeIdentity) -> None:
        self.alive.remove(who)
        index = self.coordinator.state.index_of(who)
        if index is not None:
            self.coordinator.withdraw(index)

    def step(self) -> None:
        coordinator, state = self.coordinator, self.coordinator.state
        self.now += 1
        coordinator.tick(list(self.alive), self.now, seed_at(self.now))
        listed = [c.id for c in state.epoch_state.clients]
        if state.run_state is RunState.Warmup:
            for index, who in enumerate(listed):
                if who in self.alive:
                    proof = WitnessProof(index, index, False)
                    coordinator.warmup_witness(who, Witness(proof), self.now, seed_at(self.now))
        elif state.run_state is RunState.RoundTrain:
            selection = selection_for_round(state)
            for index in selection.witness_indices():
                if index < len(listed) and listed[index] in self.alive:
                    coordinator.witness(listed[index], self.witness_for(index), self.now)
        self.steps_seen.append(state.progress.step)

    def witness_for(self, index: int) -> Witness:
        state = self.coordinator.state
        bloom = Bloom(keys=tuple(range(1, 9)))
        for client in state.epoch_state.clients:
            if client.id in self.alive:
                bloom.add(participant_item(client.id.key))
        return Witness(selection_for_round(state).witness_of(index), participant_bloom=bloom)

    def run_until(self, condition: Any, limit: int = 10_000) -> None:
        for _ in range(limit):
            if condition(self.coordinator.state):
                return
            self.step()
        raise AssertionError(f"condition not reached in {limit} ticks: {self.coordinator.state.run_state}")
