"""A coordinator in its first training round of a run that verifies, for tests of
verification reports (tests/coordinator, tests/coordinator_tcp)."""

from __future__ import annotations

import hashlib

from coordinator import Coordinator, NodeIdentity, RunState
from coordinator.config import StateFile
from coordinator.state import VerificationReport


def key(i: int) -> NodeIdentity:
    return NodeIdentity(hashlib.sha256(b"member" + i.to_bytes(2, "little")).digest())


def running(state_file: StateFile, clients: int) -> Coordinator:
    """`state_file`'s run with `clients` members in RoundTrain (round 0's seed 99), three
    steps into the epoch."""
    coordinator = Coordinator.from_state_file(state_file)
    nodes = [key(i) for i in range(clients)]
    for now in range(1_000, 1_000 + 100_000, 50):
        coordinator.tick(nodes, now, 99)
        if coordinator.state.run_state is RunState.RoundTrain:
            break
    assert coordinator.state.run_state is RunState.RoundTrain
    coordinator.state.progress.step += 3  # three steps trained in this epoch
    return coordinator


def report(reporter: NodeIdentity, accused: NodeIdentity, step: int) -> VerificationReport:
    return VerificationReport(reporter, accused, step, b"\x01" * 32, b"\x02" * 32,
                              310_000, 480_000, 1_200_000)
