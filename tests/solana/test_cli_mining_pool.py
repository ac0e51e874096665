"""run-manager's mining pool subcommands against the local validator (JSON-RPC on loopback):
a pool raised, frozen, extracted, rewarded and claimed from the command line, and every
refusal printed as one line naming the program, the error and what to do."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from typer.testing import Result

from psyche_solana import instructions as ix
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import SolanaRpc
from tests.solana.test_cli import funded_wallet, mint_for, run_cli

pytestmark = pytest.mark.timeout(300)
UNIT = 10**6  # mint_for makes 6-decimal mints


@pytest.fixture(scope="module")
def localnet():
    with Localnet() as net:
        yield net


def give(net: Localnet, owner: Keypair, mint: Pubkey, user: Pubkey, amount: int) -> None:
    async def send() -> None:
        async with SolanaRpc([net.url]) as rpc:
            await rpc.send_instructions([
                ix.create_associated_token_account(owner.pubkey(), user, mint),
                ix.mint_to(mint, ix.associated_token_address(user, mint), owner.pubkey(), amount)],
                owner)

    asyncio.run(send())


def refused(result: Result, *words: str) -> None:
    """Exit 1 with one line holding `words`."""
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    for word in words:
        assert word in lines[0], lines[0]


def show(net: Localnet, wallet: Path | None, *argv: str) -> dict:
    result = run_cli(net, wallet, "pool-show", "--index", "5", *argv)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_pool_is_raised_and_repaid_from_the_command_line(localnet, tmp_path):
    owner_path, owner = funded_wallet(tmp_path, "owner", localnet)
    one_path, one = funded_wallet(tmp_path, "one", localnet)
    two_path, two = funded_wallet(tmp_path, "two", localnet)
    intruder_path, _ = funded_wallet(tmp_path, "intruder", localnet)
    collateral = mint_for(localnet, owner, 10 * UNIT)
    give(localnet, owner, collateral, one.pubkey(), 2 * UNIT)
    give(localnet, owner, collateral, two.pubkey(), 2 * UNIT)

    created = run_cli(localnet, owner_path, "pool-create", "--index", "5", "--collateral-mint",
                      str(collateral), "--max-deposit", "3", "--metadata", '{"run": "cli"}')
    assert created.exit_code == 0, created.output
    refused(run_cli(localnet, owner_path, "pool-create", "--index", "5", "--collateral-mint",
                    str(collateral), "--max-deposit", "3"), "exists already")
    assert run_cli(localnet, one_path, "pool-deposit", "--index", "5", "--amount", "1").exit_code == 0
    assert run_cli(localnet, two_path, "pool-deposit", "--index", "5", "--amount", "2").exit_code == 0
    refused(run_cli(localnet, one_path, "pool-deposit", "--index", "5", "--amount", "0.5"),
            "mining pool", "ParamsCollateralAmountIsTooLarge", "pool-update --max-deposit")
    refused(run_cli(localnet, intruder_path, "pool-update", "--index", "5", "--freeze"),
            "mining pool", "NotPoolAuthority")
    assert run_cli(localnet, owner_path, "pool-update", "--index", "5", "--max-deposit", "10",
                   "--freeze").exit_code == 0
    refused(run_cli(localnet, one_path, "pool-deposit", "--index", "5", "--amount", "0.5"),
            "mining pool", "PoolFreezeIsTrue", "--unfreeze")
    assert run_cli(localnet, owner_path, "pool-update", "--index", "5", "--unfreeze").exit_code == 0
    refused(run_cli(localnet, one_path, "pool-deposit", "--index", "5", "--amount", "5"),
            "token program", "InsufficientFunds")
    refused(run_cli(localnet, intruder_path, "pool-extract", "--index", "5"),
            "mining pool", "NotPoolAuthority")
    refused(run_cli(localnet, one_path, "pool-claim", "--index", "5"), "not enabled yet")

    extracted = run_cli(localnet, owner_path, "pool-extract", "--index", "5")
    assert extracted.exit_code == 0 and "extracted 3000000 base units" in extracted.output
    reward = mint_for(localnet, owner, 100 * UNIT)
    refused(run_cli(localnet, intruder_path, "pool-claimable", "--index", "5", "--reward-mint",
                    str(reward)), "mining pool", "NotPoolAuthority")
    enabled = run_cli(localnet, owner_path, "pool-claimable", "--index", "5", "--reward-mint",
                      str(reward), "--amount", "10")
    assert enabled.exit_code == 0, enabled.output

    before = show(localnet, None, "--lender", str(one.pubkey()))
    assert before["lender"]["claimable_redeemable_amount"] == 10 * UNIT // 3
    assert before["redeemable_vault"]["amount"] == 10 * UNIT
    assert before["metadata"] == '{"run": "cli"}' and before["collateral_vault"]["amount"] == 0
    assert run_cli(localnet, one_path, "pool-claim", "--index", "5").exit_code == 0
    refused(run_cli(localnet, one_path, "pool-claim", "--index", "5"), "nothing to claim")
    refused(run_cli(localnet, one_path, "pool-claim", "--index", "5", "--amount", "1"),
            "mining pool", "ParamsRedeemableAmountIsTooLarge")
    refused(run_cli(localnet, intruder_path, "pool-claim", "--index", "5"), "never deposited")
    assert run_cli(localnet, two_path, "pool-claim", "--index", "5").exit_code == 0

    after = show(localnet, two_path)
    assert after["lender"]["claimed_redeemable_amount"] == 20 * UNIT // 3
    assert after["lender"]["claimable_redeemable_amount"] == 0
    assert after["total_deposited_collateral_amount"] == 3 * UNIT
    assert after["total_extracted_collateral_amount"] == 3 * UNIT
    paid = 10 * UNIT // 3 + 20 * UNIT // 3
    assert after["total_claimed_redeemable_amount"] == paid
    assert after["redeemable_vault"]["amount"] == 10 * UNIT - paid


def test_bad_arguments_are_one_line_errors(localnet, tmp_path):
    owner_path, _ = funded_wallet(tmp_path, "owner", localnet)
    bad_mint = run_cli(localnet, owner_path, "pool-create", "--index", "6", "--collateral-mint",
                       "not-a-key", "--max-deposit", "1")
    assert bad_mint.exit_code == 2 and "not a base-58 public key" in bad_mint.output
    nothing = run_cli(localnet, owner_path, "pool-update", "--index", "6")
    assert nothing.exit_code == 2 and "nothing to change" in nothing.output
    long = run_cli(localnet, owner_path, "pool-update", "--index", "6", "--metadata", "x" * 401)
    assert long.exit_code == 2 and "at most 400" in long.output
    refused(run_cli(localnet, None, "pool-show", "--index", "6"), "no pool with index 6",
            "pool-create")
    for command in ("pool-create", "pool-update", "pool-deposit", "pool-extract",
                    "pool-claimable", "pool-claim", "pool-show"):
        helped = run_cli(localnet, None, command, "-h")
        assert helped.exit_code == 0 and "--index" in helped.output
