"""wallet airdrop / balance and the token group on the local validator (loopback): an
operator's reward mint and SOL without the solana or spl-token CLIs."""

from __future__ import annotations

import re

import pytest
from solders.keypair import Keypair
from typer.testing import CliRunner

from psyche_solana.localnet import Localnet
from run_manager.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def localnet():
    with Localnet() as net:
        yield net


def _rm(net: Localnet, *argv: str):
    return runner.invoke(app, list(argv), env={"RPC": net.url})


def test_an_operator_funds_a_wallet_makes_a_reward_mint_and_sees_the_run_token(localnet, tmp_path):
    wallet = tmp_path / "owner.json"
    owner = Keypair()
    wallet.write_text(owner.to_json())
    w = ["--wallet", str(wallet)]

    dropped = _rm(localnet, "wallet", "airdrop", "12.5", *w)
    assert dropped.exit_code == 0, dropped.output
    assert "airdropped 12.500000000 SOL" in dropped.output
    shown = _rm(localnet, "wallet", "balance", *w)
    assert shown.exit_code == 0 and f"{owner.pubkey()}: 12.500000000 SOL" in shown.output

    created = _rm(localnet, "token", "create-mint", "--decimals", "6", "-w", str(wallet))
    assert created.exit_code == 0, created.output
    mint = re.search(r"mint (\S+):", created.output).group(1)
    minted = _rm(localnet, "token", "mint", "--mint", mint, "--amount", "100.25", *w)
    assert minted.exit_code == 0, minted.output
    assert "minted 100250000 base units" in minted.output and "it holds 100250000" in minted.output
    friend = Keypair().pubkey()
    to_friend = _rm(localnet, "token", "mint", "--mint", mint, "--amount", "2", "--to",
                    str(friend), *w)
    assert to_friend.exit_code == 0 and "it holds 2000000" in to_friend.output

    assert _rm(localnet, "join-authorization-create", "--permissionless", *w).exit_code == 0
    run = _rm(localnet, "create-run", "-r", "wallet-run", "-c", "v1",
              "--treasurer-collateral-mint", mint, *w)
    assert run.exit_code == 0, run.output
    assert _rm(localnet, "treasurer-top-up-rewards", "-r", "wallet-run", "--collateral-amount",
               "50", *w).exit_code == 0
    with_run = _rm(localnet, "wallet", "balance", "-r", "wallet-run", *w)
    assert with_run.exit_code == 0, with_run.output
    assert f"reward token {mint}: 50.25 (50250000 base units)" in with_run.output
    assert "0 points earned, 0 claimed, 0 claimable" in with_run.output
    theirs = _rm(localnet, "wallet", "balance", "--address", str(friend), "-r", "wallet-run")
    assert "reward token" in theirs.output and "2 (2000000 base units)" in theirs.output


def test_bad_wallet_inputs_are_one_line_errors(localnet, tmp_path):
    wallet = tmp_path / "w.json"
    wallet.write_text(Keypair().to_json())
    stranger_mint = str(Keypair().pubkey())
    for argv, code, message in (
            (["wallet", "airdrop", "1", "--address", "not-a-key"], 2,
             "--address is not a base-58 public key"),
            (["wallet", "airdrop", "1", "--wallet", str(tmp_path / "missing.json")], 2, "wallet:"),
            (["wallet", "airdrop", "inf", "--wallet", str(wallet)], 2, "must be a finite number"),
            (["wallet", "airdrop", "0", "--wallet", str(wallet)], 2, "more than 0 SOL"),
            (["wallet", "balance"], 2, "give --wallet (or RAW_WALLET_PRIVATE_KEY) or --address"),
            (["wallet", "balance", "--wallet", str(wallet), "-r", "no-such-run"], 1,
             "no run 'no-such-run'"),
            (["token", "mint", "--mint", stranger_mint, "--amount", "1", "-w", str(wallet)], 1,
             f"{stranger_mint} is not an SPL token mint"),
            (["token", "mint", "--mint", "bad", "--amount", "1", "-w", str(wallet)], 2,
             "--mint is not a base-58 public key"),
            (["wallet", "balance", "--address", str(Keypair().pubkey()), "--rpc",
              "http://127.0.0.1:9"], 1, "127.0.0.1:9")):
        result = runner.invoke(app, argv, env={"RPC": localnet.url})
        assert result.exit_code == code and message in result.output, (argv, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
