"""Compute units of the replay-class work of our coordinator program (issue 36), in LiteSVM.

    .venv/bin/python -m bench.solana_replay_classes [--clients 256]

Verification on (100 %), `--clients` joiners. Figures:
- cu_tick_distinct_classes: a WaitingForMembers tick whose joiners all have different
  classes, so none is eligible (the eligibility's worst case: every pending class sorted
  and counted, nothing listed);
- cu_tick_warmup_mixed: the tick that starts a warm-up of joiners of five classes
  (class 0 among them);
- cu_report_global / cu_report_same_class: an accepted verification report from a class-0
  trainer's follower (two elections) and from a same-class follower of a class of about
  clients / 5 (three elections);
- cu_tick_warmup_second_epoch: the next epoch's warm-up, every joiner a client of the
  last one (each pending key compared with the last epoch's clients, then eligibility).
Each line says whether the figure is within what its transaction gets: a report 200,000
(no compute-budget instruction), a tick psyche_solana.instructions.TICK_COMPUTE_UNIT_LIMIT
(every tick sender asks for it, ix.tick_with_budget); the bench exits 1 past either.
(The second epoch's warm-up with 256 returning clients is past 200,000 without classes
too: its key comparisons are 256 x 256.) The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from solders.keypair import Keypair

from coordinator import (
    NodeIdentity,
    RunState,
    load_state_file,
)
from coordinator.config import CoordinatorConfig, StateFile
from coordinator.state import VerificationReport
from coordinator.verification import plan_for_epoch
from psyche_solana.instructions import DEFAULT_INSTRUCTION_COMPUTE_UNITS, TICK_COMPUTE_UNIT_LIMIT
from psyche_solana.scenario import SvmRun

ROOT = Path(__file__).resolve().parents[1]


def _run(init_min_clients: int) -> SvmRun:
    base = load_state_file(ROOT / "config/local-testnet/state.toml")
    config = CoordinatorConfig.model_validate({
        **base.config.model_dump(), "init_min_clients": init_min_clients, "min_clients": 1,
        "witness_nodes": 1, "verification_percent": 100,
        "total_steps": 10_000, "warmup_time": 30, "max_round_train_time": 10, "epoch_time": 40,
        "round_witness_time": 1, "cooldown_time": 5, "waiting_for_members_extra_time": 1,
        "global_batch_size_start": 64, "global_batch_size_end": 64})
    state_file: StateFile = base.model_copy(update={"config": config})
    run = SvmRun.create(state_file)
    run.authorize_permissionless()
    return run


def _joined(run: SvmRun, classes: list[int]) -> list[Keypair]:
    # Keys from fixed seeds: which clients the elections pair, and so what a report costs,
    # depends on the keys, and a benchmark prints the same figures every run.
    keys = [Keypair.from_seed(hashlib.sha256(f"bench client {i}".encode()).digest())
            for i in range(len(classes))]
    for key, replay_class in zip(keys, classes, strict=True):
        run.svm.airdrop(key.pubkey(), 10**9)
        run.join(key, replay_class=replay_class)
    run.svm.advance(2)
    return keys


def distinct_classes_tick(clients: int) -> int:
    run = _run(2)
    _joined(run, [0xFFFF - 3 * i for i in range(clients)])
    units = run.tick().compute_units
    assert run.account().run_state is RunState.WaitingForMembers
    return units


def mixed_run(clients: int) -> dict[str, int]:
    run = _run(clients)
    classes = [i % 5 for i in range(clients)]
    keys = _joined(run, classes)
    figures = {"cu_tick_warmup_mixed": run.tick().compute_units}
    by_node = {NodeIdentity(bytes(key.pubkey())): key for key in keys}
    # until a trained step: round 1 under way
    run.play_until(keys, lambda s: s.run_state is RunState.RoundTrain
                   and s.progress.step > s.epoch_state.start_step, step_seconds=2)
    state = run.account().state
    assert state is not None
    class_of = {c.id: c.replay_class for c in state.epoch_state.clients}
    plan = plan_for_epoch(state.epoch_state, 100)
    for name, replay_class in (("cu_report_global", 0), ("cu_report_same_class", 1)):
        trainer = next(t for t in plan.followers if class_of[t] == replay_class)
        follower = plan.followers[trainer][0]
        report = VerificationReport(follower, trainer, state.progress.step - 1, bytes(32),
                                    bytes([1]) * 32, 1, 2, 3)
        figures[name] = run.verification_report(by_node[follower], report).compute_units
    run.play_until(keys, lambda s: s.run_state is RunState.WaitingForMembers, step_seconds=2)
    for key, replay_class in zip(keys, classes, strict=True):
        run.join(key, replay_class=replay_class)
    run.svm.advance(2)
    figures["cu_tick_warmup_second_epoch"] = run.tick().compute_units
    assert run.account().run_state is RunState.Warmup
    return figures


def budget_of(figure: str) -> int:
    """What the instruction measured gets: a tick asks for TICK_COMPUTE_UNIT_LIMIT (every
    tick sender uses ix.tick_with_budget); a report asks for nothing."""
    return TICK_COMPUTE_UNIT_LIMIT if figure.startswith("cu_tick") else DEFAULT_INSTRUCTION_COMPUTE_UNITS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=256)
    args = parser.parse_args()
    if not 3 <= args.clients <= 256:
        parser.error(f"--clients {args.clients}: between 3 and 256 (the program's MAX_CLIENTS)")
    figures = {"clients": args.clients,
               "cu_tick_distinct_classes": distinct_classes_tick(args.clients),
               **mixed_run(args.clients)}
    for name, value in figures.items():
        if name.startswith("cu_"):
            budget = budget_of(name)
            fits = "within" if value <= budget else "OVER"
            print(f"  {name:<28} {value:>9,} CU ({fits} the {budget:,} its transaction gets)")
    print(json.dumps(figures))
    return 0 if all(v <= budget_of(k) for k, v in figures.items() if k.startswith("cu_")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
