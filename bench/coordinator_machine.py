"""Coordinator throughput: full round cycles with 256 clients and 32 witnesses.

    .venv/bin/python -m bench.coordinator_machine [--rounds N]

Prints its figures, then one JSON line: ticks_per_s (coordinator ticks over whole
RoundTrain -> witnesses -> RoundWitness -> next round cycles, each cycle seeded afresh so
the elections are recomputed) and witness_msgs_per_s (accepted `witness` events).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
import tomllib
from pathlib import Path

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

ROOT = Path(__file__).resolve().parents[1]

CLIENTS, WITNESSES = 256, 32


def build() -> tuple[Coordinator, list[NodeIdentity]]:
    data = tomllib.loads((ROOT / "config" / "llama2-20m-dev" / "state.toml").read_text())
    data["config"].update(min_clients=WITNESSES, init_min_clients=CLIENTS, witness_nodes=WITNESSES,
                          global_batch_size_start=1024, global_batch_size_end=1024,
                          epoch_time=10**9, total_steps=2**31, max_round_train_time=30)
    coordinator = Coordinator.from_state_file(state_file_from_dict(data))
    nodes = [NodeIdentity(hashlib.sha256(i.to_bytes(4, "little")).digest()) for i in range(CLIENTS)]
    return coordinator, nodes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    rounds = parser.parse_args().rounds
    coordinator, nodes = build()
    state = coordinator.state
    now = 1000
    coordinator.tick(nodes, now, 1)
    now += state.config.warmup_time
    coordinator.tick([], now, 2)
    assert state.run_state is RunState.RoundTrain
    bloom = Bloom(keys=tuple(range(8)))
    for who in nodes:
        bloom.add(participant_item(who.key))
    ticks = witness_msgs = 0
    witness_seconds = 0.0
    start = time.perf_counter()
    for _ in range(rounds):
        coordinator.tick([], now, 0)  # a RoundTrain tick (nothing due)
        ticks += 1
        selection = selection_for_round(state)
        messages = [(state.epoch_state.clients[i].id, Witness(selection.witness_of(i),
                                                              participant_bloom=bloom))
                    for i in selection.witness_indices()]
        began = time.perf_counter()
        for sender, witness in messages:
            assert coordinator.witness(sender, witness, now) is None
        witness_seconds += time.perf_counter() - began
        witness_msgs += len(messages)
        now += state.config.round_witness_time
        seed = int.from_bytes(hashlib.sha256(now.to_bytes(8, "little")).digest()[:8], "little")
        coordinator.tick([], now, seed)  # RoundWitness -> next RoundTrain
        ticks += 1
        assert state.run_state is RunState.RoundTrain
    elapsed = time.perf_counter() - start
    state_bytes = len(encode_state(state))
    began = time.perf_counter()
    for _ in range(20):
        encode_state(state)
    encode_ms = (time.perf_counter() - began) / 20 * 1000
    result = {
        "clients": CLIENTS, "witnesses": WITNESSES, "rounds": rounds,
        "rounds_per_s": round(rounds / elapsed, 1),
        "ticks_per_s": round(ticks / elapsed, 1),
        "witness_msgs_per_s": round(witness_msgs / witness_seconds, 1),
        "state_bytes": state_bytes, "encode_ms": round(encode_ms, 3),
    }
    print(f"{rounds} full rounds, {CLIENTS} clients, {WITNESSES} witnesses in {elapsed:.2f} s")
    print(f"  {result['rounds_per_s']} rounds/s, {result['ticks_per_s']} ticks/s")
    print(f"  {result['witness_msgs_per_s']} witness messages/s")
    print(f"  serialized state {state_bytes} bytes, encode {encode_ms:.3f} ms")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
