"""Compute units of our coordinator program and transactions per round, in LiteSVM.

    .venv/bin/python -m bench.solana [--clients 16] [--witness-nodes 0] [--rounds 6]
                                     [--big 256]

A run of N clients (permissionless) is driven round by round like live clients do:
every elected witness sends its witness, one client ticks when the witness window has
passed. Figures: the largest compute units of join_run, tick and witness (limit 1.4M
per transaction), the transactions per round in steady state, and the worst tick with
`--big` clients (start of warm-up: every pending client compared with the last epoch's),
and the compute units of each mining pool and distributor instruction (`cu_pool_*`,
`cu_airdrop_*`, each to stay under 10 % of the limit). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from solders.instruction import Instruction
from solders.keypair import Keypair

from coordinator import RunState, load_state_file
from coordinator.config import CoordinatorConfig, StateFile
from psyche_solana.scenario import SvmRun

ROOT = Path(__file__).resolve().parents[1]

CU_LIMIT = 1_400_000


def _state_file(clients: int, witness_nodes: int) -> StateFile:
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
    assert run.account().run_state is RunState.Warmup
    for key in keys:
        if run.account().run_state is RunState.Warmup:
            warmup = run.honest_witness(key, warmup=True)
            assert warmup is not None
            run.warmup_witness(key, warmup)
    cu_witness, sent, started = 0, 0, time.perf_counter()
    for _ in range(rounds):
        assert run.account().run_state is RunState.RoundTrain
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


def pool_compute_units() -> dict[str, int]:
    """Compute units of each mining pool instruction, each sent alone, in a flow of two
    lenders (the claim is the larger of the two: its share computation and a transfer)."""
    from psyche_solana import instructions as ix
    from psyche_solana import mining_pool as mp
    from psyche_solana.svm import ProgramSvm

    svm = ProgramSvm()
    authority, lenders = Keypair(), [Keypair(), Keypair()]
    me = authority.pubkey()
    for key in (authority, *lenders):
        svm.airdrop(key.pubkey(), 10**10)
    mints = [Keypair(), Keypair()]
    rent = svm.svm.minimum_balance_for_rent_exemption(ix.MINT_SIZE)
    for mint in mints:
        svm.send(ix.create_mint(me, mint.pubkey(), rent, 6, me), [authority, mint])
    collateral, reward = (mint.pubkey() for mint in mints)
    for holder in (me, *(key.pubkey() for key in lenders)):
        for token in (collateral, reward):
            svm.send([ix.create_associated_token_account(me, holder, token),
                      ix.mint_to(token, ix.associated_token_address(holder, token), me, 10**9)],
                     [authority])
    cu: dict[str, int] = {}

    def send(name: str, instruction: Instruction, signer: Keypair) -> None:
        cu[name] = max(cu.get(name, 0), svm.send([instruction], [signer]).compute_units)

    send("cu_pool_create", mp.pool_create(me, me, 1, collateral, b"bench"), authority)
    send("cu_pool_update", mp.pool_update(me, 1, max_deposit=10**9, metadata=b"x" * 400), authority)
    for key in lenders:
        user = key.pubkey()
        send("cu_pool_lender_create", mp.lender_create(user, user, 1), key)
        send("cu_pool_lender_deposit", mp.lender_deposit(user, 1, collateral, 3 * 10**8), key)
    send("cu_pool_extract", mp.pool_extract(me, 1, collateral, 6 * 10**8), authority)
    pool = mp.pool_address(1)
    svm.send([ix.create_associated_token_account(me, pool, reward),
              ix.token_transfer_checked(ix.associated_token_address(me, reward), reward,
                                        ix.associated_token_address(pool, reward), me, 10**9, 6)],
             [authority])
    send("cu_pool_claimable", mp.pool_claimable(me, 1, reward), authority)
    for key in lenders:
        send("cu_pool_lender_claim", mp.lender_claim(key.pubkey(), 1, reward, 5 * 10**8), key)
    return cu


def airdrop_compute_units(leaves: int = 1 << 16) -> dict[str, int]:
    """Compute units of each distributor instruction, each sent alone; the redeem with a
    proof of an airdrop of `leaves` recipients (16 hashes for 65,536), at partial vesting."""
    from psyche_solana import distributor as dist
    from psyche_solana import instructions as ix
    from psyche_solana.merkle import Allocation, MerkleTree, Vesting
    from psyche_solana.svm import ProgramSvm

    svm = ProgramSvm()
    authority, claimer, mint = Keypair(), Keypair(), Keypair()
    me, user = authority.pubkey(), claimer.pubkey()
    for key in (authority, claimer):
        svm.airdrop(key.pubkey(), 10**10)
    svm.send(ix.create_mint(me, mint.pubkey(), svm.svm.minimum_balance_for_rent_exemption(
        ix.MINT_SIZE), 6, me), [authority, mint])
    for holder in (me, user):
        svm.send([ix.create_associated_token_account(me, holder, mint.pubkey())], [authority])
    svm.send([ix.mint_to(mint.pubkey(), ix.associated_token_address(me, mint.pubkey()), me,
                         10**9)], [authority])
    mine = Allocation(bytes(user), 0, Vesting(svm.now, 1000, 10**6))
    others = [Allocation(i.to_bytes(32, "little"), 0, Vesting(svm.now, 1000, 1))
              for i in range(1, leaves)]
    tree = MerkleTree([mine.leaf(), *(a.leaf() for a in others)])
    cu: dict[str, int] = {}

    def send(name: str, instruction: Instruction, signer: Keypair) -> None:
        cu[name] = max(cu.get(name, 0), svm.send([instruction], [signer]).compute_units)

    send("cu_airdrop_create", dist.airdrop_create(me, me, 1, mint.pubkey(), tree.root, b"bench"),
         authority)
    svm.send([ix.token_transfer_checked(ix.associated_token_address(me, mint.pubkey()),
                                        mint.pubkey(), dist.vault_address(1, mint.pubkey()), me,
                                        10**8, 6)], [authority])
    send("cu_airdrop_update", dist.airdrop_update(me, 1, claim_freeze=False, merkle_root=tree.root,
                                                  metadata=b"x" * 300), authority)
    send("cu_airdrop_claim_create", dist.claim_create(user, user, 1), claimer)
    svm.advance(500)
    send("cu_airdrop_claim_redeem", dist.claim_redeem(
        user, 1, mint.pubkey(), ix.associated_token_address(user, mint.pubkey()), 0,
        mine.vesting, 5 * 10**5, tree.proof(0)), claimer)
    send("cu_airdrop_withdraw", dist.airdrop_withdraw(
        me, 1, mint.pubkey(), ix.associated_token_address(me, mint.pubkey()), 10**6), authority)
    return cu


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
    pool = pool_compute_units()
    figures.update(pool)
    airdrop = airdrop_compute_units()
    figures.update(airdrop)
    print(f"{args.clients} clients, witness_nodes={args.witness_nodes}, {args.rounds} rounds")
    print(f"  join_run  {figures['cu_join']:>9,} CU (limit {CU_LIMIT:,})")
    print(f"  tick      {figures['cu_tick']:>9,} CU")
    print(f"  witness   {figures['cu_witness']:>9,} CU")
    print(f"  tx/round  {figures['tx_per_round']:>9.1f}  (witnesses + one tick)")
    print(f"  tick starting a warm-up of {args.big} clients: {figures['cu_tick_warmup_big']:,} CU")
    print(f"  LiteSVM   {figures['litesvm_tx_per_s']:>9.0f} tx/s (in-process)")
    for name, units in pool.items():
        print(f"  {name:<24} {units:>9,} CU (at most {CU_LIMIT // 10:,})")
    for name, units in airdrop.items():
        print(f"  {name:<24} {units:>9,} CU (at most {CU_LIMIT // 10:,})")
    figures = {k: round(v, 1) if isinstance(v, float) else v for k, v in figures.items()}
    print(json.dumps({"clients": args.clients, **figures}))
    worst = max(figures["cu_join"], figures["cu_tick"], figures["cu_witness"],
                figures["cu_tick_warmup_big"])
    return 0 if worst < CU_LIMIT and max(*pool.values(), *airdrop.values()) <= CU_LIMIT // 10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
