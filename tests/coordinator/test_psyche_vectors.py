"""Committee/witness election, data assignment and data index per step against values from
Psyche's own Rust functions (psyche_vectors.json; its `_note` says from which commit and how).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from coordinator_sim import node, state_file

from coordinator import (
    Client,
    Committee,
    CommitteeProof,
    CommitteeSelection,
    Coordinator,
    WitnessProof,
    assign_data_for_state,
    data_index_for_step,
)
from coordinator.config import CoordinatorConfig

VECTORS: dict[str, Any] = json.loads((Path(__file__).parent / "psyche_vectors.json").read_text())
BASE_CONFIG = state_file().config
CONFIG_KEYS = ("global_batch_size_start", "global_batch_size_end", "global_batch_size_warmup_tokens")


def case_id(case: dict[str, Any]) -> str:
    return "-".join(f"{k[:8]}={v}" for k, v in case.items()
                    if isinstance(v, int) and not isinstance(v, bool)
                    and k != "max_seq_len" and not k.startswith("num_"))


def config_for(case: dict[str, Any]) -> CoordinatorConfig:
    # model_copy skips validation: the batch-size formula is checked on any (start, end, warmup)
    update = {k: case[k] for k in CONFIG_KEYS}
    if "total_steps" in case:
        update["total_steps"] = case["total_steps"]
    return BASE_CONFIG.model_copy(update=update)


def test_note_names_the_source_commit() -> None:
    assert "0bdb13d94a05675da93d69ffa5d4c4e5a680736c" in VECTORS["_note"]["source"]


@pytest.mark.parametrize("case", VECTORS["committee_selection"], ids=case_id)
def test_committee_and_witness_selection(case: dict[str, Any]) -> None:
    n = case["total_nodes"]
    selection = CommitteeSelection(
        n=n, seed=case["seed"], witness_nodes=case["witness_nodes"],
        tie_breakers=case["tie_breaker_nodes"], verification_percent=case["verification_percent"])
    assert hashlib.sha256(case["seed"].to_bytes(8, "little")).hexdigest() == case["seed_hash"]
    assert selection.verifiers == case["num_verifier_nodes"]
    committees = [selection.committee_of(i) for i in range(n)]
    witnesses = [selection.witness_of(i) for i in range(n)]
    assert [p.index for p in committees] == list(range(n))
    assert [p.index for p in witnesses] == list(range(n))
    assert [p.committee.name for p in committees] == case["committee"]
    assert [p.position for p in committees] == case["committee_position"]
    assert [p.witness for p in witnesses] == case["witness"]
    assert [p.position for p in witnesses] == case["witness_position"]
    assert sum(p.committee is Committee.TieBreaker for p in committees) == case["num_tie_breaker_nodes"]
    assert sum(p.committee is Committee.Trainer for p in committees) == case["num_trainer_nodes"]
    assert selection.witness_indices() == [i for i in range(n) if case["witness"][i]]
    assert all(selection.verify_committee(p) for p in committees)
    assert all(selection.verify_witness(p) for p in witnesses)


@pytest.mark.parametrize("case", VECTORS["committee_selection"], ids=case_id)
def test_tampered_proofs(case: dict[str, Any]) -> None:
    selection = CommitteeSelection(
        n=case["total_nodes"], seed=case["seed"], witness_nodes=case["witness_nodes"],
        tie_breakers=case["tie_breaker_nodes"], verification_percent=case["verification_percent"])
    for proof in case["tampered_proofs"]:
        if proof["kind"] == "committee":
            ours = selection.verify_committee(
                CommitteeProof(Committee[proof["committee"]], proof["position"], proof["index"]))
        else:
            ours = selection.verify_witness(
                WitnessProof(proof["position"], proof["index"], proof["witness"]))
        assert ours == proof["valid"], proof


@pytest.mark.parametrize("case", VECTORS["assign_data_for_state"], ids=case_id)
def test_assign_data_for_state(case: dict[str, Any]) -> None:
    state = Coordinator.from_state_file(state_file()).state
    state.config = config_for(case).model_copy(
        update={"witness_nodes": case["witness_nodes"], "verification_percent": 0})
    state.model = state.model.model_copy(update={"max_seq_len": case["max_seq_len"]})
    clients = [node(i) for i in range(case["clients"])]
    state.epoch_state.clients = [Client(identity) for identity in clients]
    round_ = state.current_round
    round_.data_index = case["data_index"]
    round_.random_seed = case["random_seed"]
    round_.clients_len = case["clients"]
    round_.tie_breaker_tasks = 0
    assert state.config.batch_size(case["data_index"] * case["max_seq_len"]) == case["global_batch_size"]
    assignment = assign_data_for_state(state)
    ours = [[batch.start, batch.end, clients.index(identity)] for batch, identity in sorted(assignment.items())]
    assert ours == case["assignments"]


@pytest.mark.parametrize("case", VECTORS["data_index_for_step"], ids=case_id)
def test_data_index_for_step(case: dict[str, Any]) -> None:
    config = config_for(case)
    steps = range(case["steps_from"], case["steps_from"] + len(case["data_index"]))
    assert steps[-1] == case["total_steps"]
    assert [data_index_for_step(config, case["max_seq_len"], s) for s in steps] == case["data_index"]
    sizes = [config.batch_size(i * case["max_seq_len"]) for i in case["data_index"]]
    assert sizes == case["batch_size_at_data_index"]
    # Past the run's last step (and before step 2) Psyche's function returns 0.
    assert data_index_for_step(config, case["max_seq_len"], case["total_steps"] + 1) == 0
    assert data_index_for_step(config, case["max_seq_len"], 0) == 0


@pytest.mark.parametrize("case", VECTORS["get_batch_size"], ids=case_id)
def test_get_batch_size(case: dict[str, Any]) -> None:
    config = config_for(case)
    assert [config.batch_size(tokens) for tokens in case["tokens"]] == case["batch_size"]
