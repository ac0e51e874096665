"""run-manager's Solana subcommands against the local validator (JSON-RPC on loopback)."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from typer.testing import CliRunner

from psyche_solana import instructions as ix
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import SolanaRpc
from run_manager.cli import app

runner = CliRunner()
STATE = Path("config/local-testnet/state.toml")


@pytest.fixture(scope="module")
def localnet():
    with Localnet() as net:
        yield net


def funded_wallet(tmp_path: Path, name: str, net: Localnet, sol: int = 20) -> tuple[Path, Keypair]:
    keypair = Keypair()
    path = tmp_path / f"{name}.json"
    path.write_text(keypair.to_json())

    async def fund() -> None:
        async with SolanaRpc([net.url]) as rpc:
            await rpc.airdrop(keypair.pubkey(), sol * 10**9)

    asyncio.run(fund())
    return path, keypair


def mint_for(net: Localnet, owner: Keypair, amount: int) -> Pubkey:
    mint = Keypair()

    async def make() -> None:
        async with SolanaRpc([net.url]) as rpc:
            rent = await rpc.minimum_balance(ix.MINT_SIZE)
            await rpc.send_instructions(
                ix.create_mint(owner.pubkey(), mint.pubkey(), rent, 6, owner.pubkey()), owner, [mint])
            account = ix.associated_token_address(owner.pubkey(), mint.pubkey())
            await rpc.send_instructions([
                ix.create_associated_token_account(owner.pubkey(), owner.pubkey(), mint.pubkey()),
                ix.mint_to(mint.pubkey(), account, owner.pubkey(), amount)], owner)

    asyncio.run(make())
    return mint.pubkey()


def run_cli(net: Localnet, wallet: Path | None, *argv: str):
    env = {"RPC": net.url}
    if wallet is not None:
        env["WALLET_PRIVATE_KEY_PATH"] = str(wallet)
    return runner.invoke(app, list(argv), env=env)


def test_a_treasurer_run_is_managed_from_the_command_line(localnet, tmp_path):
    owner_path, owner = funded_wallet(tmp_path, "owner", localnet)
    intruder_path, _ = funded_wallet(tmp_path, "intruder", localnet)
    mint = mint_for(localnet, owner, 10 * 10**6)
    ok = run_cli(localnet, owner_path, "join-authorization-create", "--permissionless")
    assert ok.exit_code == 0, ok.output
    ok = run_cli(localnet, owner_path, "create-run", "-r", "cli-run", "-c", "v1",
              "--treasurer-collateral-mint", str(mint))
    assert ok.exit_code == 0, ok.output
    for argv in (["update-config", "-r", "cli-run", "--config-path", str(STATE)],
                 ["set-future-epoch-rates", "-r", "cli-run", "--earning-rate-total-shared", "0.0009"],
                 ["set-paused", "-r", "cli-run", "--resume"],
                 ["treasurer-top-up-rewards", "-r", "cli-run", "--collateral-amount", "1.5"]):
        result = run_cli(localnet, owner_path, *argv)
        assert result.exit_code == 0, (argv, result.output)

    refused = run_cli(localnet, intruder_path, "set-paused", "-r", "cli-run")
    assert refused.exit_code == 1
    assert "NotMainAuthority: only the run's main authority may do this" in refused.output
    nothing = run_cli(localnet, owner_path, "treasurer-claim-rewards", "-r", "cli-run")
    assert nothing.exit_code == 1 and "NothingToClaim" in nothing.output

    stranger = str(Keypair().pubkey())
    assert run_cli(localnet, None, "can-join", "-r", "cli-run", "--address", stranger).exit_code == 0
    listed = run_cli(localnet, None, "list-runs", "--all")
    assert "cli-run" in listed.output and "WaitingForMembers" in listed.output
    dump = json.loads(run_cli(localnet, None, "json-dump-run", "-r", "cli-run").output)
    assert dump["coordinator_account"]["status"]["state"] == "WaitingForMembers"
    assert dump["coordinator_account"]["epoch"]["rates"]["future"]["earning_rate_total_shared"] == 900
    assert dump["treasurer_run"]["collateral_mint"] == str(mint)
    user = json.loads(run_cli(localnet, None, "json-dump-user", "-r", "cli-run",
                           "--address", str(owner.pubkey())).output)
    assert user["lamports"] > 0 and user["treasurer_participant"] is None

    async def vault_balance() -> int:
        async with SolanaRpc([localnet.url]) as rpc:
            run = ix.treasurer_run_address(ix.default_treasurer_index("cli-run"))
            data = await rpc.account_data(ix.associated_token_address(run, mint))
            return ix.token_amount(data)

    assert asyncio.run(vault_balance()) == 1_500_000

    deleted = run_cli(localnet, owner_path, "join-authorization-delete", "--authorizer", str(Pubkey.default()))
    assert deleted.exit_code == 0, deleted.output
    no = run_cli(localnet, None, "can-join", "-r", "cli-run", "--address", stranger)
    assert no.exit_code == 1 and "no active join authorization" in no.output


def test_delegates_and_bad_arguments(localnet, tmp_path):
    owner_path, owner = funded_wallet(tmp_path, "owner", localnet)
    grantee_path, grantee = funded_wallet(tmp_path, "grantee", localnet)
    assert run_cli(localnet, owner_path, "create-run", "-r", "cli-delegates", "-c", "v1").exit_code == 0
    assert run_cli(localnet, owner_path, "join-authorization-create", "--authorizer",
                str(grantee.pubkey())).exit_code == 0
    machine = Keypair().pubkey()
    added = run_cli(localnet, grantee_path, "join-authorization-delegate", "--join-authority",
                 str(owner.pubkey()), "--delegates-added", str(machine))
    assert added.exit_code == 0, added.output
    halted = run_cli(localnet, None, "can-join", "-r", "cli-delegates", "--address", str(machine),
                  "--authorizer", str(grantee.pubkey()))
    assert "authorized" in halted.output and "Uninitialized" in halted.output
    bad = run_cli(localnet, owner_path, "join-authorization-create", "--authorizer", "not-a-key")
    assert bad.exit_code == 2 and "not a base-58 public key" in bad.output
    missing = run_cli(localnet, None, "json-dump-run", "-r", "no-such-run")
    assert missing.exit_code == 1 and "no run 'no-such-run'" in missing.output
    bad_config = tmp_path / "bad.toml"
    bad_config.write_text("run_id = 1\n")
    rejected = run_cli(localnet, owner_path, "update-config", "-r", "cli-delegates",
                    "--config-path", str(bad_config))
    assert rejected.exit_code == 2 and "invalid config" in rejected.output


async def test_the_run_manager_reads_the_client_version_and_state_on_chain(localnet, tmp_path):
    from coordinator import load_state_file
    from psyche_solana.runs import admin, create_run, find_run, update_instructions
    from run_manager.sources import (
        CoordinatorSource,
        CoordinatorUnavailable,
        SolanaCoordinatorSource,
    )

    async with SolanaRpc([localnet.url]) as rpc:
        owner = Keypair()
        await rpc.airdrop(owner.pubkey(), 20 * 10**9)
        await create_run(rpc, owner, "watched", "v7")
        run = await find_run(rpc, "watched")
        await admin(rpc, run, owner, [
            *update_instructions(run, owner.pubkey(), load_state_file(STATE), None),
            ix.set_paused(run.address, owner.pubkey(), False)])
    source = SolanaCoordinatorSource([localnet.url], "watched")
    assert isinstance(source, CoordinatorSource)
    assert await source.client_version() == "v7"
    snapshot = await source.snapshot()
    assert snapshot.phase == "WaitingForMembers" and snapshot.run_id == "watched"
    assert snapshot.joined == 0  # nobody joined yet: the registry has no pending client
    await source.close()
    missing = SolanaCoordinatorSource([localnet.url], "nope")
    with pytest.raises(CoordinatorUnavailable, match="no run 'nope'"):
        await missing.client_version()
    await missing.close()


def test_a_run_id_is_taken_once_and_found_through_its_claim(localnet, tmp_path):
    from psyche_solana.accounts import COORDINATOR_ACCOUNT_SIZE
    from psyche_solana.rpc import ProgramError
    from psyche_solana.runs import find_run

    owner_path, owner = funded_wallet(tmp_path, "owner", localnet)
    squatter_path, squatter = funded_wallet(tmp_path, "squatter", localnet)
    assert run_cli(localnet, owner_path, "create-run", "-r", "contested", "-c", "v1").exit_code == 0
    refused = run_cli(localnet, squatter_path, "create-run", "-r", "contested", "-c", "v1")
    assert refused.exit_code == 1 and "run id 'contested' is already taken" in refused.output

    async def squat() -> tuple[str, Pubkey]:
        """Past the client's check: the program refuses a second claim of the id, and an
        uninitialized account of the coordinator's size does not disturb the lookups."""
        copy, junk = Keypair(), Keypair()
        async with SolanaRpc([localnet.url]) as rpc:
            rent = await rpc.minimum_balance(COORDINATOR_ACCOUNT_SIZE)
            await rpc.send_instructions([ix.create_coordinator_account(
                squatter.pubkey(), junk.pubkey(), rent)], squatter, [junk])
            with pytest.raises(ProgramError) as caught:
                await rpc.send_instructions([
                    ix.create_coordinator_account(squatter.pubkey(), copy.pubkey(), rent),
                    ix.init_coordinator(copy.pubkey(), squatter.pubkey(), "contested",
                                        squatter.pubkey(), squatter.pubkey(), "v1")],
                    squatter, [copy])
            run = await find_run(rpc, "contested")
            assert run.account.main_authority == owner.pubkey()
            assert run.instance == ix.coordinator_instance_address("contested")
            return caught.value.name, run.address

    name, address = asyncio.run(squat())
    assert name == "AlreadyInitialized"
    listed = run_cli(localnet, None, "list-runs", "--all").output.splitlines()
    contested = [line for line in listed if line.startswith("contested ")]
    assert len(contested) == 1 and contested[0].endswith(str(address))
    dump = json.loads(run_cli(localnet, None, "json-dump-run", "-r", "contested").output)
    assert dump["coordinator_instance"]["address"] == str(ix.coordinator_instance_address("contested"))
    assert dump["coordinator_account"]["address"] == str(address)


def test_psyches_wallet_forms_and_solana_test_config_shape(localnet, tmp_path):
    """-w/--wallet-private-key-path and RAW_WALLET_PRIVATE_KEY in base58 (Psyche's forms,
    the raw key winning as in Psyche), and update-config with a file holding only [config]
    and [model] (the shape of Psyche's config/solana-test/*.toml)."""
    import tomli_w

    owner_path, owner = funded_wallet(tmp_path, "owner", localnet)
    decoy_path, _ = funded_wallet(tmp_path, "decoy", localnet)
    created = runner.invoke(app, ["create-run", "-r", "psyche-shape", "-c", "v1", "-w", str(owner_path)],
                            env={"RPC": localnet.url})
    assert created.exit_code == 0, created.output
    state = tomllib.loads(STATE.read_text())
    state["model"]["LLM"]["data_location"] = {"Http": {
        "location": {"SingleUrl": "https://example.org/000.ds"},
        "token_size_in_bytes": "TwoBytes", "shuffle": "DontShuffle"}}
    config = tmp_path / "nano-like.toml"
    config.write_text(tomli_w.dumps({"config": state["config"], "model": state["model"]}))
    updated = runner.invoke(app, ["update-config", "-r", "psyche-shape", "--config-path", str(config),
                                  "-w", str(decoy_path)],
                            env={"RPC": localnet.url, "RAW_WALLET_PRIVATE_KEY": str(owner)})
    assert updated.exit_code == 0, updated.output
    assert "RAW_WALLET_PRIVATE_KEY and --wallet-private-key-path" in updated.output
    dump = json.loads(run_cli(localnet, None, "json-dump-run", "-r", "psyche-shape").output)
    assert dump["coordinator_account"]["setup"]["config"]["total_steps"] == state["config"]["total_steps"]
    location = dump["coordinator_account"]["setup"]["model"]["data_location"]
    assert "example.org/000.ds" in json.dumps(location)
    bad = runner.invoke(app, ["tick", "-r", "psyche-shape", "--count", "1"],
                        env={"RPC": localnet.url, "RAW_WALLET_PRIVATE_KEY": "[1, 2]"})
    assert bad.exit_code == 2 and "wallet: RAW_WALLET_PRIVATE_KEY is not a solana-keygen keypair" in bad.output


def test_update_config_restarts_from_a_step_and_switches_to_the_hub(localnet, tmp_path):
    """Psyche's --restart-from-step (the step, and its data index replayed through the
    batch-size ramp) and --switch-to-hub (a P2P or Dummy checkpoint becomes Hub)."""
    import tomli_w

    from coordinator import data_index_for_step, load_state_file
    from coordinator.config import HubCheckpoint
    from psyche_solana.rpc import SolanaRpc
    from psyche_solana.runs import find_run

    owner_path, _ = funded_wallet(tmp_path, "owner", localnet)
    assert run_cli(localnet, owner_path, "create-run", "-r", "restarted", "-c", "v1").exit_code == 0
    state = tomllib.loads(STATE.read_text())
    state["model"]["LLM"]["checkpoint"] = {"Dummy": {"repo_id": "org/model"}}
    config = tmp_path / "dummy.toml"
    config.write_text(tomli_w.dumps(state))
    first = run_cli(localnet, owner_path, "update-config", "-r", "restarted", "--config-path", str(config))
    assert first.exit_code == 0, first.output
    restarted = run_cli(localnet, owner_path, "update-config", "-r", "restarted",
                     "--restart-from-step", "7", "--switch-to-hub")
    assert restarted.exit_code == 0, restarted.output

    async def read() -> object:
        async with SolanaRpc([localnet.url]) as rpc:
            return (await find_run(rpc, "restarted")).account.state

    on_chain = asyncio.run(read())
    expected = load_state_file(config)
    assert on_chain.progress.step == 7
    assert on_chain.progress.epoch_start_data_index == data_index_for_step(
        expected.config, expected.model.max_seq_len, 7) > 0
    assert on_chain.model.checkpoint == HubCheckpoint(repo_id="org/model")
    nothing = run_cli(localnet, owner_path, "update-config", "-r", "restarted")
    assert nothing.exit_code == 2 and "--restart-from-step" in nothing.output
