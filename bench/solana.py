"""Compute units of our coordinator program and transactions per round, in LiteSVM.

    .venv/bin/python -m bench.solana [--clients 16] [--witness-nodes 0] [--rounds 6]
                                     [--big 256]

A run of N clients (permissionless) is driven round by round like live clients do:
every elected witness sends its witness, one client ticks when the witness window has
passed. Figures: the largest compute units of join_run, tick and witness (limit 1.4M
per transaction), the transactions per round in steady state, and the worst tick with
`--big` clients (start of warm-up: every pending client compared with the last epoch's).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from solders.keypair import Keypair

from coordinator import RunState, load_state_file
from coordinator.config import CoordinatorConfig
from psyche_solana.scenario import SvmRun

ROOT = Path(__file__).resolve().parents[1]

CU_LIMIT = 1_400_000


def _state_file(clients: int, witness_nodes: int):
    base = load_state_file(ROOT / "config/local-testnet/state.toml")
    config = CoordinatorConfig.model_validate({
        **base.config.model_dump(), "init_min_clients": clients, "min_clients": 1,
        "witness_nodes": min(witness_nodes, 1) if witness_nodes else 0,
        "epoch_time": 10_000, "total_steps": 10_000, "warmup_time": 30,
        "max_round_train_time": 10, "round_witness_time": 1, "cooldown_time": 5,
        "waiting_for_members_extra_time": 1, "global_batch_size_start": 64,
        "global_batch_size_end": 64})
    return base.model_copy(update={"config": config})


def measure(clients: int, witness_nodes: int, rounds: int) -> dict[str, float]:
    run = SvmRun.create(_state_file(clients, witness_nodes))
    run.authorize_permissionless()
    keys = [Keypair() for _ in range(clients)]
    cu_join = 0
    for key in keys:
        run.svm.airdrop(key.pubkey(), 10**9)
        cu_join = max(cu_join, run.join(key).compute_units)
    run.svm.advance(2)
    cu_tick = run.tick().compute_units
    assert run.account().state.run_state is RunState.Warmup
    for key in keys:
        if run.account().state.run_state is RunState.Warmup:
            run.warmup_witness(key, run.honest_witness(key, warmup=True))
    cu_witness, sent, started = 0, 0, time.perf_counter()
    for _ in range(rounds):
        assert run.account().state.run_state is RunState.RoundTrain
        for key in keys:
            witness = run.honest_witness(key)
            if witness is not None:
                cu_witness = max(cu_witness, run.witness(key, witness).compute_units)
                sent += 1
        run.svm.advance(2)
        cu_tick = max(cu_tick, run.tick().compute_units)
        sent += 1
    elapsed = time.perf_counter() - started
    return {"cu_join": cu_join, "cu_tick": cu_tick, "cu_witness": cu_witness,
            "tx_per_round": sent / rounds, "litesvm_tx_per_s": sent / elapsed}


def worst_warmup_tick(clients: int) -> int:
    """Tick that starts a warm-up with `clients` pending, none from the last epoch."""
    run = SvmRun.create(_state_file(clients, 0))
    run.authorize_permissionless()
    keys = [Keypair() for _ in range(clients)]
    for key in keys:
        run.svm.airdrop(key.pubkey(), 10**9)
        run.join(key)
    run.svm.advance(2)
    return run.tick().compute_units


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--witness-nodes", type=int, default=0,
                        help="0: every client up to 32 witnesses (Psyche's default)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--big", type=int, default=256)
    args = parser.parse_args()
    figures = measure(args.clients, args.witness_nodes, args.rounds)
    figures["cu_tick_warmup_big"] = worst_warmup_tick(args.big) if args.big else 0
    print(f"{args.clients} clients, witness_nodes={args.witness_nodes}, {args.rounds} rounds")
    print(f"  join_run  {figures['cu_join']:>9,} CU (limit {CU_LIMIT:,})")
    print(f"  tick      {figures['cu_tick']:>9,} CU")
    print(f"  witness   {figures['cu_witness']:>9,} CU")
    print(f"  tx/round  {figures['tx_per_round']:>9.1f}  (witnesses + one tick)")
    print(f"  tick starting a warm-up of {args.big} clients: {figures['cu_tick_warmup_big']:,} CU")
    print(f"  LiteSVM   {figures['litesvm_tx_per_s']:>9.0f} tx/s (in-process)")
    figures = {k: round(v, 1) if isinstance(v, float) else v for k, v in figures.items()}
    print(json.dumps({"clients": args.clients, **figures}))
    worst = max(figures["cu_join"], figures["cu_tick"], figures["cu_witness"],
                figures["cu_tick_warmup_big"])
    return 0 if worst < CU_LIMIT else 1


if __name__ == "__main__":
    raise SystemExit(main())
