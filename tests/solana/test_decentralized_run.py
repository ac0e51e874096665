"""A whole decentralized run on the local validator: the run is created through the
treasurer, a key and its delegate are authorized, two real clients (tiny Llama, local
data, iroh on loopback) join through the Solana backend and train an epoch; points are
counted, rewards topped up and claimed, and the balance moves by the right amount."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from solders.keypair import Keypair

from client_image.backends.solana import SolanaBackend, SolanaBackendOptions
from client_image.client_config import ClientConfig
from client_image.p2p import NodeConfig
from client_image.runtime import client as client_module
from client_image.runtime.client import ClientOptions, PsycheClient
from client_image.runtime.observability import EventLog
from coordinator import RunState
from coordinator.config import parse_state_toml
from psyche_common.identity import Identity
from psyche_solana import instructions as ix
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import ProgramError, SolanaRpc
from psyche_solana.runs import admin, authorize, claim, create_run, find_run, update_instructions

# Both clients run in this process: import transformers' lazy model classes once, up
# front, rather than from two loader threads at the same time.
from transformers import AutoModelForCausalLM  # noqa: F401  isort: skip

STATE_TOML = """
run_id = "solana-e2e"
run_state = "Uninitialized"
client_version = "test"

[config]
warmup_time = 30
cooldown_time = 3
epoch_time = 120
max_round_train_time = 15
round_witness_time = 1
min_clients = 2
init_min_clients = 2
global_batch_size_start = 4
global_batch_size_end = 4
global_batch_size_warmup_tokens = 0
verification_percent = 0
witness_nodes = 0
total_steps = 4
waiting_for_members_extra_time = 1

[model.LLM]
architecture = "HfLlama"
data_type = "Pretraining"
max_seq_len = 64
cold_start_warmup_steps = 0
data_location = { Local = "assets/data/train" }
checkpoint = { Hub = { repo_id = "assets/tiny-llama" } }

[model.LLM.lr_schedule.Constant]
base_lr = 1.0e-3
warmup_steps = 0
warmup_init_lr = 0.0

[model.LLM.optimizer.Distro]
compression_decay = 0.999
compression_chunk = 16
compression_topk = 4
quantize_1bit = true
"""


def _client(wallet: Keypair, net: Localnet, run_id: str, tmp_path: Path) -> PsycheClient:
    identity = Identity(bytes(wallet)[:32])
    assert identity.public_key == bytes(wallet.pubkey())  # one Ed25519 key: signer and p2p id
    config = ClientConfig.of(run_id=run_id, server_addr="solana:", device="cpu",
                             checkpoint_dir=tmp_path / f"ckpt-{wallet.pubkey()}")
    options = ClientOptions(config, identity=identity,
                            node_config=NodeConfig(bind_ip="127.0.0.1", relay_mode="disabled"))
    return PsycheClient(options, EventLog("none"))


@pytest.mark.timeout(300)
async def test_two_clients_train_an_epoch_on_the_local_validator_and_claim_rewards(
        tmp_path, monkeypatch):
    try:
        state_file = parse_state_toml(STATE_TOML)
    except Exception as exc:  # pragma: no cover - a config problem is a test bug
        pytest.fail(f"bad test config: {exc}")
    with Localnet() as net:
        rpc = SolanaRpc([net.url])
        owner, grantee, delegate = Keypair(), Keypair(), Keypair()
        for key in (owner, grantee, delegate):
            await rpc.airdrop(key.pubkey(), 50 * 10**9)
        mint = Keypair()
        await rpc.send_instructions(ix.create_mint(
            owner.pubkey(), mint.pubkey(), await rpc.minimum_balance(ix.MINT_SIZE), 6,
            owner.pubkey()), owner, [mint])
        owner_tokens = ix.associated_token_address(owner.pubkey(), mint.pubkey())
        await rpc.send_instructions([
            ix.create_associated_token_account(owner.pubkey(), owner.pubkey(), mint.pubkey()),
            ix.mint_to(mint.pubkey(), owner_tokens, owner.pubkey(), 10_000)], owner)

        await create_run(rpc, owner, "solana-e2e", "test", collateral_mint=mint.pubkey())
        authorization = await authorize(rpc, owner, grantee.pubkey())
        await rpc.send_instructions([ix.authorization_grantee_update(
            grantee.pubkey(), authorization, False, [delegate.pubkey()])], grantee)
        run = await find_run(rpc, "solana-e2e")
        assert run.treasurer is not None
        authority = ix.treasurer_run_address(run.treasurer_index)
        await admin(rpc, run, owner, [
            *update_instructions(run, authority, state_file, None),
            ix.set_future_epoch_rates(run.address, authority, 1000, None),
            ix.set_paused(run.address, authority, False)])

        # The runtime takes its backend from client_image.runtime.client.TcpBackend today;
        # this factory is the one-line change the runtime needs (see the report).
        wallets = {}

        def backend_factory(server_addr, identity, run_id, p2p_address, client_version="",
                            replay_class=0):
            return SolanaBackend(SolanaBackendOptions(
                rpc=[net.url], ws_rpc=[net.ws_url], wallet=wallets[identity.public_key],
                run_id=run_id,
                p2p_address=p2p_address, client_version=client_version,
                authorizer=grantee.pubkey(), replay_class=replay_class))

        monkeypatch.setattr(client_module, "TcpBackend", backend_factory)
        clients = []
        for wallet in (grantee, delegate):
            wallets[bytes(wallet.pubkey())] = wallet
            clients.append(_client(wallet, net, "solana-e2e", tmp_path))
        tasks = [asyncio.create_task(c.run()) for c in clients]
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                account = (await find_run(rpc, "solana-e2e")).account
                if account.run_state in (RunState.Finished,) or any(t.done() for t in tasks):
                    break
                await asyncio.sleep(1)
            for task in tasks:
                if task.done():
                    task.result()  # surface a client crash
        finally:
            for c in clients:
                c.stop()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 30)
            # A cancelled client leaves its model work (asyncio.to_thread) running; let it
            # end here, not inside a later test (transformers' loading flags are global).
            await asyncio.wait_for(asyncio.get_running_loop().shutdown_default_executor(), 60)
        account = (await find_run(rpc, "solana-e2e")).account
        assert account.run_state is RunState.Finished, account.run_state
        assert account.state.progress.epoch == 1
        assert account.earned(grantee.pubkey()) == 500 == account.earned(delegate.pubkey())
        assert all(c.counters.step >= 3 for c in clients)
        # each client joined with the replay class of its own declared settings (issue 36)
        epoch = account.state.epoch_state
        assert {c.id.key: c.replay_class for c in (*epoch.clients, *epoch.exited_clients)} \
            == {c.me.key: c.replay_class for c in clients}
        assert all(c.replay_class != 0 for c in clients)

        run = await find_run(rpc, "solana-e2e")
        vault = ix.associated_token_address(authority, mint.pubkey())
        await rpc.send_instructions([ix.token_transfer_checked(
            owner_tokens, mint.pubkey(), vault, owner.pubkey(), 1000, 6)], owner)
        assert await claim(rpc, run, grantee) == 500
        grantee_tokens = await rpc.account_data(
            ix.associated_token_address(grantee.pubkey(), mint.pubkey()))
        assert ix.token_amount(grantee_tokens) == 500
        with pytest.raises(ProgramError, match="NothingToClaim"):
            await claim(rpc, run, grantee)
        await rpc.close()
