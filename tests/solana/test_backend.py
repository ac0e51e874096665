"""The client's Solana backend on the local validator: refusals are clear and fatal where
retrying cannot help; a corrupt account does not stop the watcher; messages become
transactions; the bench runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from client_image.backends.base import BackendRejected
from client_image.backends.solana import (
    SolanaBackend,
    SolanaBackendOptions,
    tick_order,
    tick_place,
)
from coordinator import load_state_file
from coordinator.config import HubCheckpoint
from coordinator.limits import RunState
from coordinator.messages import CheckpointReport
from coordinator.state import CoordinatorState, Progress
from psyche_solana import instructions as ix
from psyche_solana.accounts import CoordinatorAccount
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import SolanaRpc
from psyche_solana.runs import admin, authorize, create_run, find_run, update_instructions

STATE = load_state_file("config/local-testnet/state.toml")


@pytest.fixture(scope="module")
def net():
    with Localnet() as localnet:
        yield localnet


async def _run(net, run_id: str, permissionless: bool) -> Keypair:
    async with SolanaRpc([net.url]) as rpc:
        owner = Keypair()
        await rpc.airdrop(owner.pubkey(), 20 * 10**9)
        await create_run(rpc, owner, run_id, "v1")
        run = await find_run(rpc, run_id)
        await admin(rpc, run, owner, [*update_instructions(run, owner.pubkey(), STATE, None),
                                      ix.set_paused(run.address, owner.pubkey(), False)])
        if permissionless:
            from solders.pubkey import Pubkey

            await authorize(rpc, owner, Pubkey.default())
    return owner


async def test_an_unauthorized_client_is_refused_with_a_clear_message(net):
    await _run(net, "closed-run", permissionless=False)
    wallet = Keypair()
    backend = SolanaBackend(SolanaBackendOptions(rpc=[net.url], wallet=wallet, run_id="closed-run",
                                                 p2p_address="x"))
    with pytest.raises(BackendRejected, match="NotAuthorized: no active join authorization"):
        await backend.run(_ignore_state, lambda e: None, asyncio.Event())


async def _ignore_state(state) -> None:
    return None


async def test_the_backend_joins_delivers_state_and_maps_messages(net):
    await _run(net, "open-run", permissionless=True)
    wallet = Keypair()
    async with SolanaRpc([net.url]) as rpc:
        await rpc.airdrop(wallet.pubkey(), 5 * 10**9)
    states, errors = [], []
    stop = asyncio.Event()

    async def on_state(server_state) -> None:
        states.append(server_state)

    backend = SolanaBackend(SolanaBackendOptions(
        rpc=[net.url], wallet=wallet, run_id="open-run", p2p_address=f"{bytes(wallet.pubkey()).hex()}@127.0.0.1:1",
        ws_rpc=[net.ws_url], check_interval_s=0.05, replay_class=0xA11C))
    task = asyncio.create_task(backend.run(on_state, errors.append, stop))
    for _ in range(200):
        if backend.account is not None and backend.account.pending == [wallet.pubkey()]:
            break
        await asyncio.sleep(0.05)
    assert backend.account.pending == [wallet.pubkey()]  # joined by itself
    # with its replay class (issue 36), which the warm-up will copy into its client entry
    assert backend.account.replay_classes == {wallet.pubkey(): 0xA11C}
    assert states and states[-1].state.run_id == "open-run"
    # not a client of an epoch yet: the program refuses, the backend reports the word
    refused = await backend.report_checkpoint(
        CheckpointReport(index=0, repo=HubCheckpoint(repo_id="a/b")))
    assert refused is False and errors and errors[-1].error == "InvalidClientIndex"
    assert await backend.withdraw() is False
    # waiting for 3 members: a tick would not change anything yet
    assert backend.tick_would_change(backend.account, 2**40) is False
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_a_corrupt_account_does_not_stop_the_watcher(net):
    from solders.account import Account

    await _run(net, "corrupt-run", permissionless=True)
    wallet = Keypair()
    async with SolanaRpc([net.url]) as rpc:
        await rpc.airdrop(wallet.pubkey(), 5 * 10**9)
        run = await find_run(rpc, "corrupt-run")
    states = []

    async def on_state(server_state) -> None:
        states.append(server_state)

    stop = asyncio.Event()
    backend = SolanaBackend(SolanaBackendOptions(rpc=[net.url], wallet=wallet, run_id="corrupt-run",
                                                 p2p_address="x", ws_rpc=[net.ws_url], check_interval_s=0.05))
    task = asyncio.create_task(backend.run(on_state, lambda e: None, stop))
    # Corrupt only once the backend's own join is delivered and nothing more is on its way:
    # a join notification still in flight would otherwise arrive after the corruption.
    quiet_since, seen = asyncio.get_running_loop().time(), 0
    for _ in range(200):
        account = backend.account
        joined = account is not None and wallet.pubkey() in dict(account.registry)
        if len(states) != seen:
            quiet_since, seen = asyncio.get_running_loop().time(), len(states)
        if joined and states and asyncio.get_running_loop().time() - quiet_since > 0.3:
            break
        await asyncio.sleep(0.05)
    assert states and backend.account is not None
    assert wallet.pubkey() in dict(backend.account.registry)
    engine = net.validator.engine.svm
    with net.validator.lock:
        good = engine.get_account(run.address)
        broken = bytearray(good.data)
        broken[216] = 99  # run_state out of range
        broken[16] ^= 0xFF  # and a new nonce, so the watcher reads it
        engine.set_account(run.address, Account(good.lamports, bytes(broken), good.owner,
                                                good.executable, good.rent_epoch))
        net.validator.written()  # subscribers are told, as after a transaction
    delivered = len(states)
    await asyncio.sleep(0.4)
    assert not task.done() and len(states) == delivered  # logged, skipped, still watching
    with net.validator.lock:
        repaired = bytearray(good.data)
        repaired[16] ^= 0x0F
        engine.set_account(run.address, Account(good.lamports, bytes(repaired), good.owner,
                                                good.executable, good.rent_epoch))
        net.validator.written()
    for _ in range(100):
        if len(states) > delivered:
            break
        await asyncio.sleep(0.05)
    assert len(states) > delivered
    stop.set()
    await asyncio.wait_for(task, 10)


def test_who_sends_a_due_tick_is_one_order_every_client_computes_anew_at_each_change():
    keys = [Pubkey(bytes([i]) * 32) for i in range(1, 6)]

    def account(nonce: int) -> CoordinatorAccount:
        # Every key pending for the next epoch (no state yet): the order is over them.
        return CoordinatorAccount(
            version=1, nonce=nonce, main_authority=keys[0], join_authority=keys[0],
            run_id="r", client_version="", config_set=False, model_set=False, next_active=1,
            registry=[(key, 1) for key in keys], state=None)

    first = tick_order(account(7))
    assert sorted(first) == sorted(bytes(k) for k in keys)
    assert tick_order(account(7)) == first  # pure: the same bytes on every client
    assert {tuple(tick_order(account(n))) for n in range(8)} != {tuple(first)}
    assert [tick_place(account(7), key) for key in first] == [0, 1, 2, 3, 4]
    assert tick_place(account(7), bytes(32)) == 5  # not in the run: after every member


def test_the_tick_order_holds_through_a_phase_and_is_drawn_anew_at_the_next():
    keys = [Pubkey(bytes([i]) * 32) for i in range(1, 6)]

    def account(nonce: int, step: int) -> CoordinatorAccount:
        state = CoordinatorState(run_id="r", run_state=RunState.RoundTrain, model=STATE.model,
                                 config=STATE.config, progress=Progress(step=step),
                                 run_state_start_unix_timestamp=1_800_000_000)
        return CoordinatorAccount(
            version=1, nonce=nonce, main_authority=keys[0], join_authority=keys[0],
            run_id="r", client_version="", config_set=True, model_set=True, next_active=1,
            registry=[(key, 1) for key in keys], state=state)

    # a join or a witness changes the nonce, not the phase: the same order, so the key
    # first in line keeps its place while its tick is in flight
    first = tick_order(account(7, 1))
    assert all(tick_order(account(n, 1)) == first for n in range(8, 20))
    assert {tuple(tick_order(account(7, step))) for step in range(1, 9)} != {tuple(first)}


def test_bench_smoke():
    out = subprocess.run([sys.executable, "-m", "bench.solana", "--clients", "3", "--rounds", "2",
                          "--big", "4"], capture_output=True, text=True, timeout=120, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0 < figures["cu_join"] < 1_400_000 and 0 < figures["cu_witness"] < 1_400_000
    assert figures["tx_per_round"] == 4.0  # 3 witnesses + 1 tick
