"""The pure, deterministic Psyche coordinator: no I/O, no clock, no randomness but the seed.

How a backend (TCP server, Solana program, simulation) uses it::

    from coordinator import Coordinator, load_state_file, encode_state

    coordinator = Coordinator.from_state_file(load_state_file("state.toml"))
    # every 500 ms, with the ids of connected clients that asked to join:
    result = coordinator.tick(pending, now=unix_seconds, seed=os_random_u64)
    # on client messages (each returns None, or a Rejected value to send back):
    coordinator.warmup_witness(sender, witness, now, seed)
    coordinator.witness(sender, witness, now)
    coordinator.health_check(sender, [(node, committee_proof), ...])
    coordinator.checkpoint(sender, index, HubCheckpoint(repo_id=..., revision=...))
    coordinator.withdraw(index); coordinator.pause(now); coordinator.resume(now)
    # then broadcast the state:
    payload = encode_state(coordinator.state)      # decode_state(payload) on the client

Clients run the same functions on the same state to derive their role and data:
`selection_for_round(state).witness_of(i)`, `assign_data_for_state(state)`.
Errors are values (`Rejected`), never exceptions that could stop a server; a rejected
call leaves the state untouched.
"""

from coordinator.bloom import Bloom, fnv1a64
from coordinator.commitment import data_hash, finished_hash, merkle_root, participant_item
from coordinator.committee import (
    Committee,
    CommitteeProof,
    CommitteeSelection,
    SelectionError,
    WitnessProof,
    witness_quorum,
)
from coordinator.config import ConfigError, StateFile, load_data_config, load_state_file
from coordinator.data_assignment import (
    BatchId,
    assign_data_for_state,
    data_index_for_step,
    selection_for_round,
    split_batches,
)
from coordinator.limits import (
    MAX_CLIENTS,
    MAX_WITNESSES,
    NUM_STORED_ROUNDS,
    ClientState,
    RunState,
)
from coordinator.machine import Coordinator
from coordinator.outcomes import CoordinatorError, Rejected, TickResult
from coordinator.rewards import earned_points, set_future_rates
from coordinator.serialization import StateDecodeError, decode_state, encode_state
from coordinator.shuffle import Lcg, lcg_shuffle, swap_or_not
from coordinator.state import (
    Client,
    CoordinatorState,
    EpochState,
    NodeIdentity,
    Progress,
    Rewards,
    Round,
    Witness,
)

__all__ = [
    "MAX_CLIENTS", "MAX_WITNESSES", "NUM_STORED_ROUNDS", "BatchId", "Bloom",
    "Client", "ClientState", "Committee", "CommitteeProof", "CommitteeSelection", "ConfigError",
    "Coordinator", "CoordinatorError", "CoordinatorState", "EpochState", "Lcg",
    "NodeIdentity", "Progress", "Rejected", "Rewards", "Round", "RunState", "SelectionError",
    "StateDecodeError", "StateFile", "TickResult", "Witness", "WitnessProof",
    "assign_data_for_state", "data_hash", "data_index_for_step", "decode_state",
    "earned_points", "encode_state", "finished_hash", "fnv1a64", "lcg_shuffle",
    "load_data_config", "load_state_file", "merkle_root",
    "participant_item", "selection_for_round", "set_future_rates",
    "split_batches", "swap_or_not", "witness_quorum",
]
