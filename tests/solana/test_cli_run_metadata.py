"""run-manager's update-config metadata flags, json-dump-run's setup.metadata, list-runs'
names, close-run of a treasurer run and Psyche's --ws-rpc/--ws-rpc-2, against the local
validator (the real programs behind psyche-localnet's JSON-RPC) on loopback."""

from __future__ import annotations

import asyncio
import json

import pytest
from solders.pubkey import Pubkey

from psyche_solana.localnet import Localnet
from psyche_solana.rpc import SolanaRpc
from psyche_solana.run_metadata import metadata_address
from psyche_solana.runs import RunHandle, find_run
from run_manager.cli import app
from tests.solana.test_cli import STATE, funded_wallet, mint_for, run_cli, runner

pytestmark = pytest.mark.timeout(300)
EMPTY = {"name": "", "description": "", "num_parameters": 0, "vocab_size": 0}


@pytest.fixture(scope="module")
def localnet():
    with Localnet() as net:
        yield net


def _handle(net: Localnet, run_id: str) -> RunHandle:
    async def read() -> RunHandle:
        async with SolanaRpc([net.url]) as rpc:
            return await find_run(rpc, run_id)

    return asyncio.run(read())


def _exists(net: Localnet, address: Pubkey) -> bool:
    async def read() -> bool:
        async with SolanaRpc([net.url]) as rpc:
            return await rpc.account_data(address) is not None

    return asyncio.run(read())


def _balance(net: Localnet, address: Pubkey) -> int:
    async def read() -> int:
        async with SolanaRpc([net.url]) as rpc:
            return await rpc.balance(address)

    return asyncio.run(read())


def _metadata(net: Localnet, run_id: str) -> dict:
    dump = run_cli(net, None, "json-dump-run", "-r", run_id)
    assert dump.exit_code == 0, dump.output
    return json.loads(dump.output)["coordinator_account"]["setup"]["metadata"]


def test_update_config_sets_the_metadata_that_json_dump_and_list_runs_show(localnet, tmp_path):
    owner_path, _ = funded_wallet(tmp_path, "owner", localnet)
    intruder_path, _ = funded_wallet(tmp_path, "intruder", localnet)
    assert run_cli(localnet, owner_path, "create-run", "-r", "named", "-c", "v1").exit_code == 0
    assert _metadata(localnet, "named") == EMPTY  # Psyche's default before any is set
    set_ = run_cli(localnet, owner_path, "update-config", "-r", "named", "--name", "Nice run ✓",
                "--description", "20M on FineWeb", "--num-parameters", "20000000",
                "--vocab-size", "32000")
    assert set_.exit_code == 0, set_.output
    nice = {"name": "Nice run ✓", "description": "20M on FineWeb", "num_parameters": 20_000_000,
            "vocab_size": 32_000}
    assert _metadata(localnet, "named") == nice
    # one flag changes one field, as Psyche's; with the other flags in the same command
    both = run_cli(localnet, owner_path, "update-config", "-r", "named", "--vocab-size", "50000",
                "--client-version", "v2", "--config-path", str(STATE))
    assert both.exit_code == 0, both.output
    assert _metadata(localnet, "named") == {**nice, "vocab_size": 50_000}
    dump = json.loads(run_cli(localnet, None, "json-dump-run", "-r", "named").output)
    assert dump["coordinator_account"]["setup"]["client_version"] == "v2"
    listed = [line for line in run_cli(localnet, None, "list-runs", "--all").output.splitlines()
              if line.startswith("named ")]
    assert len(listed) == 1 and listed[0].endswith("  Nice run ✓")

    for flags, message in ((["--name", "é" * 33], "--name is 66 bytes of UTF-8, at most 64"),
                           (["--description", "d" * 281], "--description is 281 bytes"),
                           (["--num-parameters", "-1"], "--num-parameters must be 0 to"),
                           (["--vocab-size", str(2**64)], "--vocab-size must be 0 to")):
        bad = run_cli(localnet, owner_path, "update-config", "-r", "named", *flags)
        assert bad.exit_code == 2 and message in bad.output, (flags, bad.output)
        assert len(bad.output.strip().splitlines()) == 1
    refused = run_cli(localnet, intruder_path, "update-config", "-r", "named", "--name", "evil")
    assert refused.exit_code == 1 and "NotMainAuthority" in refused.output
    assert _metadata(localnet, "named")["name"] == "Nice run ✓"

    address = _handle(localnet, "named").address
    assert _exists(localnet, metadata_address(address))
    closed = run_cli(localnet, owner_path, "close-run", "-r", "named")
    assert closed.exit_code == 0, closed.output
    assert not _exists(localnet, metadata_address(address))  # closed with the run


def test_a_treasurer_run_takes_metadata_and_is_closed_through_the_treasurer(localnet, tmp_path):
    owner_path, owner = funded_wallet(tmp_path, "owner", localnet)
    intruder_path, _ = funded_wallet(tmp_path, "intruder", localnet)
    mint = mint_for(localnet, owner, 10**6)
    assert run_cli(localnet, owner_path, "create-run", "-r", "treasury", "-c", "v1",
                "--treasurer-collateral-mint", str(mint)).exit_code == 0
    named = run_cli(localnet, owner_path, "update-config", "-r", "treasury", "--config-path",
                 str(STATE), "--name", "Rewarded", "--num-parameters", "7")
    assert named.exit_code == 0, named.output
    assert _metadata(localnet, "treasury") == {**EMPTY, "name": "Rewarded", "num_parameters": 7}
    assert run_cli(localnet, owner_path, "set-paused", "-r", "treasury", "--resume").exit_code == 0
    running = run_cli(localnet, owner_path, "close-run", "-r", "treasury")
    assert running.exit_code == 1 and "pause it first" in running.output
    assert run_cli(localnet, owner_path, "set-paused", "-r", "treasury").exit_code == 0
    refused = run_cli(localnet, intruder_path, "close-run", "-r", "treasury")
    assert refused.exit_code == 1 and "NotMainAuthority" in refused.output

    run = _handle(localnet, "treasury")
    assert run.treasurer is not None
    before = _balance(localnet, owner.pubkey())
    closed = run_cli(localnet, owner_path, "close-run", "-r", "treasury")
    assert closed.exit_code == 0, closed.output
    assert "the run id is free again" in closed.output and "note:" not in closed.output
    for address in (run.address, run.instance, metadata_address(run.address)):
        assert not _exists(localnet, address)
    assert _balance(localnet, owner.pubkey()) - before > 700_000_000  # the state's rent
    gone = run_cli(localnet, None, "json-dump-run", "-r", "treasury")
    assert gone.exit_code == 1 and "no run 'treasury'" in gone.output


def test_psyches_websocket_options_are_accepted_and_checked(localnet):
    accepted = runner.invoke(app, ["list-runs", "--all", "--rpc", localnet.url, "--ws-rpc",
                                   "ws://127.0.0.1:8900", "--ws-rpc-2", "wss://example.org"])
    assert accepted.exit_code == 0 and "Traceback" not in accepted.output, accepted.output
    from_env = runner.invoke(app, ["list-runs", "--all"], env={"RPC": localnet.url,
                                                      "WS_RPC": "ws://127.0.0.1:8900"})
    assert from_env.exit_code == 0, from_env.output
    for argv, env in ((["--ws-rpc", "http://127.0.0.1:8900"], {}),
                      (["--ws-rpc-2", "127.0.0.1:8900"], {}),
                      ([], {"WS_RPC": "https://example.org"})):
        bad = runner.invoke(app, ["json-dump-run", "-r", "any", "--rpc", localnet.url, *argv],
                            env=env)
        assert bad.exit_code == 2, (argv, env, bad.output)
        assert "must be a ws:// or wss:// URL" in bad.output
        assert len(bad.output.strip().splitlines()) == 1
    for command in ("create-run", "close-run", "update-config", "treasurer-claim-rewards"):
        shown = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80"})
        assert "--ws-rpc" in shown.output and "--ws-rpc-2" in shown.output, command


def test_close_run_keeps_a_treasurer_run_whose_points_are_not_claimed(tmp_path):
    """An epoch played (500 points each for two clients, none claimed): close-run refuses
    in one line and the run stays; --force closes it and says what was left."""
    from solders.keypair import Keypair

    from psyche_solana.localnet import LocalValidator
    from psyche_solana.scenario import SvmRun
    from tests.solana.test_differential import small_run_state

    run = SvmRun.create(small_run_state(2, 2, 1, 10), treasurer=True)
    clients = [Keypair(), Keypair()]
    for key in clients:
        run.svm.airdrop(key.pubkey(), 10**9)
    run.authorize_permissionless()
    run.set_rates(1000, None)
    for key in clients:
        run.join(key)
    run.svm.advance(2)
    run.tick()
    run.play_epoch(clients)  # the run's last epoch: it ends Finished
    run_id = run.account().run_id
    owner_path = tmp_path / "owner.json"
    owner_path.write_text(json.dumps(list(bytes(run.authority))))
    with Localnet(validator=LocalValidator(run.svm)) as net:
        assert _handle(net, run_id).account.run_state.name == "Finished"
        refused = run_cli(net, owner_path, "close-run", "-r", run_id)
        assert refused.exit_code == 1, refused.output
        assert "1000 earned points are not claimed yet" in refused.output
        assert "--force" in refused.output and "Traceback" not in refused.output
        assert _exists(net, run.address)
        forced = run_cli(net, owner_path, "close-run", "-r", run_id, "--force")
        assert forced.exit_code == 0, forced.output
        assert "note (--force): 1000 earned points were not claimed" in forced.output
        assert not _exists(net, run.address)
