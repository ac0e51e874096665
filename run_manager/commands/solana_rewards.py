"""The Solana subcommands for a treasurer run's rewards: top up the vault, claim."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from run_manager.commands.solana_common import (
    LOCALNET_URL,
    ProgramId,
    Rpc,
    Rpc2,
    RunId,
    TreasurerIndex,
    Wallet,
    parse_amount,
    run_rpc,
    signing_keypair,
)


def treasurer_top_up_rewards(run_id: RunId,
                             collateral_amount: Annotated[str, typer.Option(
                                 help="In token units, e.g. 1.5 (scaled by the mint's "
                                      "decimals).")],
                             wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                             program_id: ProgramId = None,
                             treasurer_index: TreasurerIndex = None) -> None:
    """Add reward tokens to a treasurer run's vault."""
    from psyche_solana.runs import find_run, mint_decimals, top_up

    payer = signing_keypair(wallet)

    async def work(client: Any) -> int:
        run = await find_run(client, run_id, treasurer_index)
        if run.treasurer is None:
            raise ValueError(f"run {run_id!r} has no treasurer")
        decimals = await mint_decimals(client, run.treasurer.collateral_mint)
        return await top_up(client, run, payer,
                            parse_amount(collateral_amount, decimals, "--collateral-amount"))

    amount = run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"topped up {run_id!r} with {amount} base units")


def treasurer_claim_rewards(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                            program_id: ProgramId = None,
                            treasurer_index: TreasurerIndex = None,
                            points: Annotated[int | None, typer.Option(
                                help="Default: every unclaimed point.")] = None) -> None:
    """Claim the reward tokens for your earned points (1 base unit per point)."""
    from psyche_solana.runs import claim, find_run

    user = signing_keypair(wallet)

    async def work(client: Any) -> int:
        return await claim(client, await find_run(client, run_id, treasurer_index), user, points)

    amount = run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"claimed {amount} points = {amount} base units")
