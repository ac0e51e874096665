"""run-manager's airdrop subcommands (the distributor program) against the local
validator's JSON-RPC on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from solders.keypair import Keypair

from psyche_solana import instructions as ix
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import SolanaRpc
from run_manager.cli import app
from tests.solana.refusals import one_line_error
from tests.solana.test_cli import funded_wallet, mint_for, run_cli, runner

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def localnet():
    with Localnet() as net:
        yield net


def _balance(net: Localnet, owner: Keypair, mint: str) -> int:
    from solders.pubkey import Pubkey

    async def read() -> int:
        async with SolanaRpc([net.url]) as rpc:
            data = await rpc.account_data(ix.associated_token_address(
                owner.pubkey(), Pubkey.from_string(mint)))
            return 0 if data is None else ix.token_amount(data)

    return asyncio.run(read())


def test_an_airdrop_is_created_claimed_shown_and_withdrawn_from_the_command_line(localnet, tmp_path):
    authority_path, authority = funded_wallet(tmp_path, "authority", localnet)
    recipients = [funded_wallet(tmp_path, f"r{i}", localnet) for i in range(3)]
    outsider_path, _ = funded_wallet(tmp_path, "outsider", localnet)
    mint = str(mint_for(localnet, authority, 100 * 10**6))
    now = int(time.time())
    rows = ["claimer,amount,vesting_start,vesting_duration",
            f"{recipients[0][1].pubkey()},2.5,{now - 100},0",            # all vested
            f"{recipients[1][1].pubkey()},10,{now - 1000},4000",          # about a quarter
            f"{recipients[2][1].pubkey()},1,{now + 10**6},60"]            # not started
    allocations = tmp_path / "allocations.csv"
    allocations.write_text("\n".join(rows) + "\n")
    proofs = tmp_path / "proofs.json"
    made = run_cli(localnet, authority_path, "airdrop-create", "--allocations", str(allocations),
                   "--collateral-mint", mint, "--airdrop-id", "5", "--proofs-out", str(proofs))
    assert made.exit_code == 0, made.output
    written = json.loads(proofs.read_text())
    assert f"merkle root {written['merkle_root']}" in made.output
    assert [a["amount"] for a in written["allocations"]] == [2_500_000, 10_000_000, 1_000_000]

    ok = run_cli(localnet, recipients[0][0], "airdrop-claim", "--proofs", str(proofs))
    assert ok.exit_code == 0, ok.output
    assert _balance(localnet, recipients[0][1], mint) == 2_500_000
    ok = run_cli(localnet, recipients[1][0], "airdrop-claim", "--proofs", str(proofs))
    assert ok.exit_code == 0, ok.output
    quarter = _balance(localnet, recipients[1][1], mint)
    assert 2_500_000 <= quarter < 3_000_000  # 1000-odd of 4000 s elapsed

    one_line_error(run_cli(localnet, recipients[2][0], "airdrop-claim", "--proofs", str(proofs)),
                   "nothing to claim now")
    one_line_error(run_cli(localnet, recipients[2][0], "airdrop-claim", "--proofs", str(proofs),
                           "--amount", "0.5"), "distributor", "NothingVestedYet")
    one_line_error(run_cli(localnet, recipients[0][0], "airdrop-claim", "--proofs", str(proofs),
                           "--amount", "1"), "distributor", "MoreThanVested")
    one_line_error(run_cli(localnet, outsider_path, "airdrop-claim", "--proofs", str(proofs)),
                   "no allocation")
    one_line_error(run_cli(localnet, outsider_path, "airdrop-withdraw", "--airdrop-id", "5"),
                   "distributor", "NotAirdropAuthority")

    shown = run_cli(localnet, None, "airdrop-show", "--airdrop-id", "5", "--proofs", str(proofs))
    assert shown.exit_code == 0, shown.output
    state = json.loads(shown.output)
    assert state["authority"] == str(authority.pubkey()) and state["merkle_root"] == written["merkle_root"]
    assert state["total_claimed_collateral_amount"] == 2_500_000 + quarter
    assert state["vault"]["amount"] == 13_500_000 - 2_500_000 - quarter
    assert [a["claimed"] for a in state["allocations"]] == [2_500_000, quarter, 0]
    assert state["allocations"][2]["vested"] == 0

    before = _balance(localnet, authority, mint)
    ok = run_cli(localnet, authority_path, "airdrop-withdraw", "--airdrop-id", "5")
    assert ok.exit_code == 0, ok.output
    assert _balance(localnet, authority, mint) == before + state["vault"]["amount"]
    shown = run_cli(localnet, None, "airdrop-show", "--airdrop-id", "5")
    assert json.loads(shown.output)["vault"]["amount"] == 0
    one_line_error(run_cli(localnet, authority_path, "airdrop-withdraw", "--airdrop-id", "5",
                           "--amount", "1"), "distributor", "InsufficientFunds")


@pytest.mark.parametrize("command,words", [
    ("airdrop-create", ["--allocations", "--collateral-mint", "--proofs-out", "--no-fund"]),
    ("airdrop-claim", ["--proofs", "--nonce", "--amount"]),
    ("airdrop-withdraw", ["--airdrop-id", "--amount"]),
    ("airdrop-show", ["--airdrop-id", "--proofs"]),
])
def test_every_airdrop_command_has_help(command: str, words: list[str]) -> None:
    result = runner.invoke(app, [command, "-h"])
    assert result.exit_code == 0, result.output
    for word in words:
        assert word in result.output


@pytest.mark.parametrize("content,words", [
    ("claimer,amount\nx,1\n", ["CSV header lacks vesting_start"]),
    ("claimer,amount,vesting_start,vesting_duration\nnot-a-key,1,0,0\n", ["line 2", "base-58"]),
    ("claimer,amount,vesting_start,vesting_duration\n{key},abc,0,0\n", ["line 2", "amount"]),
    ("claimer,amount,vesting_start,vesting_duration\n{key},1.0000001,0,0\n", ["decimals"]),
    ("claimer,amount,vesting_start,vesting_duration\n{key},1,2024-01-01T00:00,0\n", ["time zone"]),
    ("claimer,amount,vesting_start,vesting_duration\n{key},1,0,-5\n", ["line 2", "u32"]),
    ("claimer,amount,vesting_start,vesting_duration\n{key},1,0,0\n{key},2,0,0\n", ["appears twice"]),
    ('[{"claimer": "{key}", "amount": 1}]', ["item 0", "needs"]),
    ('{"allocations": 3}', ["list of allocations"]),
    ("[1, 2", ["not valid JSON"]),
])
def test_a_bad_allocations_file_is_named_in_one_line(localnet: Localnet, tmp_path: Path, content: str,
                                                     words: list[str]) -> None:
    authority_path, authority = funded_wallet(tmp_path, "authority", localnet)
    mint = str(mint_for(localnet, authority, 10))
    path = tmp_path / "allocations.txt"
    path.write_text(content.replace("{key}", str(Keypair().pubkey())))
    result = run_cli(localnet, authority_path, "airdrop-create", "--allocations", str(path),
                     "--collateral-mint", mint)
    assert result.exit_code == 2
    one_line_error(result, *words)


def test_a_bad_proofs_file_and_an_unknown_airdrop_are_one_line_errors(localnet: Localnet,
                                                                      tmp_path: Path) -> None:
    wallet, _ = funded_wallet(tmp_path, "someone", localnet)
    bad = tmp_path / "proofs.json"
    bad.write_text('{"airdrop_id": 1}')
    one_line_error(run_cli(localnet, wallet, "airdrop-claim", "--proofs", str(bad)),
                   "not a proofs file")
    one_line_error(run_cli(localnet, None, "airdrop-show", "--airdrop-id", "424242"),
                   "no airdrop with id 424242")
