"""run-manager's Solana subcommands that complete Psyche's set (join-authorization-read,
close-run, checkpoint, ...), against the local validator on loopback."""

from __future__ import annotations

import asyncio
import json

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from psyche_solana import instructions as ix
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import SolanaRpc
from run_manager.cli import app
from tests.solana.test_cli import STATE, funded_wallet, mint_for, run_cli, runner


@pytest.fixture(scope="module")
def localnet():
    with Localnet() as net:
        yield net


def test_join_authorization_read_and_a_second_create(localnet, tmp_path):
    owner_path, owner = funded_wallet(tmp_path, "owner", localnet)
    grantee = Keypair().pubkey()
    none = run_cli(localnet, None, "join-authorization-read", "--join-authority", str(owner.pubkey()),
                "--authorizer", str(grantee))
    assert none.exit_code == 1
    assert f"no authorization from {owner.pubkey()} for {grantee}" in none.output
    assert run_cli(localnet, owner_path, "join-authorization-create", "--authorizer",
                str(grantee)).exit_code == 0
    read = run_cli(localnet, None, "join-authorization-read", "--join-authority", str(owner.pubkey()),
                "--authorizer", str(grantee))
    assert read.exit_code == 0, read.output
    shown = json.loads(read.output)
    assert shown["grantor"] == str(owner.pubkey()) and shown["grantee"] == str(grantee)
    assert shown["active"] is True and shown["scope"] == "CoordinatorJoinRun"
    assert shown["permissionless"] is False and shown["delegates"] == []

    again = run_cli(localnet, owner_path, "join-authorization-create", "--authorizer", str(grantee))
    assert again.exit_code == 1
    assert "already exists (active)" in again.output and "Traceback" not in again.output
    assert len(again.output.strip().splitlines()) == 1

    permissionless = run_cli(localnet, None, "join-authorization-read", "--join-authority",
                          str(owner.pubkey()))
    assert permissionless.exit_code == 1 and str(Pubkey.default()) in permissionless.output
    bad = run_cli(localnet, None, "join-authorization-read", "--join-authority", "nope")
    assert bad.exit_code == 2 and "--join-authority is not a base-58 public key" in bad.output


def _balance(net: Localnet, key: Pubkey) -> int:
    async def read() -> int:
        async with SolanaRpc([net.url]) as rpc:
            return await rpc.balance(key)

    return asyncio.run(read())


def _account(net: Localnet, key: Pubkey) -> bytes | None:
    async def read() -> bytes | None:
        async with SolanaRpc([net.url]) as rpc:
            return await rpc.account_data(key)

    return asyncio.run(read())


def test_close_run_returns_the_rent_and_frees_the_run_id(localnet, tmp_path):
    from psyche_solana.runs import find_run

    owner_path, owner = funded_wallet(tmp_path, "owner", localnet)
    intruder_path, _ = funded_wallet(tmp_path, "intruder", localnet)
    assert run_cli(localnet, owner_path, "create-run", "-r", "closing", "-c", "v1").exit_code == 0
    assert run_cli(localnet, owner_path, "update-config", "-r", "closing", "--config-path",
                str(STATE)).exit_code == 0
    assert run_cli(localnet, owner_path, "set-paused", "-r", "closing", "--resume").exit_code == 0

    async def handle():
        async with SolanaRpc([localnet.url]) as rpc:
            return await find_run(rpc, "closing")

    run = asyncio.run(handle())
    running = run_cli(localnet, owner_path, "close-run", "-r", "closing")
    assert running.exit_code == 1 and "is WaitingForMembers: pause it first" in running.output
    assert run_cli(localnet, owner_path, "set-paused", "-r", "closing").exit_code == 0
    refused = run_cli(localnet, intruder_path, "close-run", "-r", "closing")
    assert refused.exit_code == 1 and "NotMainAuthority" in refused.output

    before = _balance(localnet, owner.pubkey())
    closed = run_cli(localnet, owner_path, "close-run", "-r", "closing")
    assert closed.exit_code == 0, closed.output
    assert "the run id is free again" in closed.output
    assert _account(localnet, run.address) is None and _account(localnet, run.instance) is None
    # both rents (the 100 KiB state's and the claim's) came back, less one fee
    assert _balance(localnet, owner.pubkey()) - before > 700_000_000
    gone = run_cli(localnet, None, "json-dump-run", "-r", "closing")
    assert gone.exit_code == 1 and "no run 'closing'" in gone.output
    assert "closing " not in run_cli(localnet, None, "list-runs", "--all").output
    again = run_cli(localnet, owner_path, "close-run", "-r", "closing")
    assert again.exit_code == 1 and "no run 'closing'" in again.output
    assert run_cli(localnet, intruder_path, "create-run", "-r", "closing", "-c", "v2").exit_code == 0


def test_the_program_refuses_to_free_a_running_run_or_a_wrong_claim(localnet, tmp_path):
    """Past the command's checks: the program itself keeps a running run and refuses a
    claim that does not name the account."""
    from psyche_solana.rpc import ProgramError
    from psyche_solana.runs import find_run

    owner_path, owner = funded_wallet(tmp_path, "owner", localnet)
    for run_id in ("free-a", "free-b"):
        assert run_cli(localnet, owner_path, "create-run", "-r", run_id, "-c", "v1").exit_code == 0
    assert run_cli(localnet, owner_path, "update-config", "-r", "free-a", "--config-path",
                str(STATE)).exit_code == 0
    assert run_cli(localnet, owner_path, "set-paused", "-r", "free-a", "--resume").exit_code == 0

    async def attempts() -> list[str]:
        names = []
        async with SolanaRpc([localnet.url]) as rpc:
            a, b = await find_run(rpc, "free-a"), await find_run(rpc, "free-b")
            for instruction in (
                    ix.free_coordinator(a.address, owner.pubkey(), "free-a", owner.pubkey()),
                    ix.free_coordinator(b.address, owner.pubkey(), "free-a", owner.pubkey())):
                with pytest.raises(ProgramError) as caught:
                    await rpc.send_instructions([instruction], owner)
                names.append(caught.value.name)
            assert await rpc.account_data(a.address) and await rpc.account_data(b.instance)
        return names

    assert asyncio.run(attempts()) == ["NotHalted", "WrongAccount"]


def test_checkpoint_sets_a_paused_runs_hub_checkpoint(localnet, tmp_path):
    from coordinator.config import HubCheckpoint
    from psyche_solana.runs import find_run

    owner_path, _ = funded_wallet(tmp_path, "owner", localnet)
    intruder_path, _ = funded_wallet(tmp_path, "intruder", localnet)
    assert run_cli(localnet, owner_path, "create-run", "-r", "ckpt", "-c", "v1").exit_code == 0
    assert run_cli(localnet, owner_path, "update-config", "-r", "ckpt", "--config-path",
                str(STATE)).exit_code == 0

    set_ = run_cli(localnet, owner_path, "checkpoint", "-r", "ckpt", "--repo", "org/model",
                "--revision", "abc123")
    assert set_.exit_code == 0, set_.output

    async def state():
        async with SolanaRpc([localnet.url]) as rpc:
            return (await find_run(rpc, "ckpt")).account.state

    before = asyncio.run(state())
    assert before.model.checkpoint == HubCheckpoint(repo_id="org/model", revision="abc123")
    refused = run_cli(localnet, intruder_path, "checkpoint", "-r", "ckpt", "--repo", "evil/model")
    assert refused.exit_code == 1 and "NotMainAuthority" in refused.output
    too_long = run_cli(localnet, owner_path, "checkpoint", "-r", "ckpt", "--repo", "x" * 65)
    assert too_long.exit_code == 2 and "1 to 64 bytes" in too_long.output
    assert run_cli(localnet, owner_path, "set-paused", "-r", "ckpt", "--resume").exit_code == 0
    running = run_cli(localnet, owner_path, "checkpoint", "-r", "ckpt", "--repo", "org/other")
    assert running.exit_code == 1 and "sets the checkpoint of a paused run" in running.output
    after = asyncio.run(state())
    assert after.model == before.model  # the rest of the model is untouched


def test_accept_model_loss_is_refused_in_one_line_while_nothing_is_lost(localnet, tmp_path):
    # Taking a run to MODEL LOST needs an epoch of training; the program's side of the
    # instruction (authority only, waiting or paused, the fall back counted) is played on
    # chain by tests/solana/test_differential.py. Here: what the operator is told.
    owner_path, _ = funded_wallet(tmp_path, "owner", localnet)
    assert run_cli(localnet, owner_path, "create-run", "-r", "lost", "-c", "v1").exit_code == 0
    assert run_cli(localnet, owner_path, "update-config", "-r", "lost", "--config-path",
                   str(STATE)).exit_code == 0
    nothing = run_cli(localnet, owner_path, "accept-model-loss", "-r", "lost")
    assert nothing.exit_code == 1, nothing.output
    assert "as new as its clients' model, nothing to accept" in nothing.output
    assert "Traceback" not in nothing.output
    unknown = run_cli(localnet, owner_path, "accept-model-loss", "-r", "no-such-run")
    assert unknown.exit_code != 0 and "Traceback" not in unknown.output
    helped = run_cli(localnet, None, "accept-model-loss", "--help")
    assert helped.exit_code == 0 and "stored checkpoint" in helped.output


def test_epoch_rates_take_decimals_and_bad_values_are_one_line(localnet, tmp_path):
    owner_path, owner = funded_wallet(tmp_path, "owner", localnet)
    mint = mint_for(localnet, owner, 10**6)
    assert run_cli(localnet, owner_path, "create-run", "-r", "rates-tr", "-c", "v1",
                "--treasurer-collateral-mint", str(mint)).exit_code == 0
    assert run_cli(localnet, owner_path, "create-run", "-r", "rates-pts", "-c", "v1").exit_code == 0
    for run_id in ("rates-tr", "rates-pts"):  # the rates are shown once a config is set
        assert run_cli(localnet, owner_path, "update-config", "-r", run_id, "--config-path",
                    str(STATE)).exit_code == 0
    tokens = run_cli(localnet, owner_path, "set-future-epoch-rates", "-r", "rates-tr",
                  "--earning-rate-total-shared", "1.5", "--slashing-rate-per-client", "0.25")
    assert tokens.exit_code == 0, tokens.output
    points = run_cli(localnet, owner_path, "set-future-epoch-rates", "-r", "rates-pts",
                  "--earning-rate-total-shared", "1200")
    assert points.exit_code == 0, points.output

    def future(run_id: str) -> dict:
        dump = json.loads(run_cli(localnet, None, "json-dump-run", "-r", run_id).output)
        return dump["coordinator_account"]["epoch"]["rates"]["future"]

    assert future("rates-tr") == {"earning_rate_total_shared": 1_500_000,
                                  "slashing_rate_per_client": 250_000}  # 6-decimal mint
    assert future("rates-pts")["earning_rate_total_shared"] == 1200
    for run_id, value, message in (
            ("rates-tr", "0.0000001", "more precision than the amount allows (6 decimal places)"),
            ("rates-pts", "2.5", "more precision than the amount allows (whole numbers)"),
            ("rates-pts", "-3", "must be a finite number >= 0"),
            ("rates-pts", "nan", "must be a finite number >= 0"),
            ("rates-pts", "lots", "not a number: 'lots'"),
            ("rates-pts", str(2**64), "is too large")):
        bad = run_cli(localnet, owner_path, "set-future-epoch-rates", "-r", run_id,
                   "--earning-rate-total-shared", value)
        assert bad.exit_code == 2 and message in bad.output, (value, bad.output)
        assert len(bad.output.strip().splitlines()) == 1
    assert future("rates-pts")["earning_rate_total_shared"] == 1200
    nothing = run_cli(localnet, owner_path, "set-future-epoch-rates", "-r", "rates-pts")
    assert nothing.exit_code == 2 and "nothing to set" in nothing.output
    unknown = run_cli(localnet, owner_path, "set-future-epoch-rates", "-r", "no-such-run",
                   "--earning-rate-total-shared", "1")
    assert unknown.exit_code == 1 and "no run 'no-such-run'" in unknown.output


def test_list_runs_takes_the_connection_options(localnet, tmp_path):
    owner_path, _ = funded_wallet(tmp_path, "owner", localnet)
    assert run_cli(localnet, owner_path, "create-run", "-r", "listed", "-c", "v1").exit_code == 0
    from psyche_solana.ids import coordinator_program

    ours = str(coordinator_program())
    listed = runner.invoke(app, ["list-runs", "--all", "--rpc", "http://127.0.0.1:9", "--rpc-2",
                                 localnet.url, "--coordinator-program-id", ours])
    assert listed.exit_code == 0 and "listed " in listed.output, listed.output
    other = runner.invoke(app, ["list-runs", "--all", "--rpc", localnet.url,
                                "--coordinator-program-id", str(Keypair().pubkey())])
    assert other.exit_code == 0 and other.output.strip() == "no runs"
    assert str(coordinator_program()) == ours  # the override lasted one command
    bad = runner.invoke(app, ["list-runs", "--all", "--rpc", localnet.url,
                              "--coordinator-program-id", "not-a-key"])
    assert bad.exit_code == 2
    assert "--coordinator-program-id is not a base-58 public key" in bad.output

