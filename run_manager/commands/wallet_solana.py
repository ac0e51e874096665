"""What an operator needs on a local or test cluster without the solana / spl-token
CLIs: `wallet airdrop`, `wallet balance` (SOL, and with -r the run's reward token and
points), and `token create-mint` / `token mint` for a reward mint of their own.

The wallet is `--wallet` / `-w` / `--wallet-private-key-path` (env WALLET_PRIVATE_KEY_PATH)
or RAW_WALLET_PRIVATE_KEY, as for the Solana subcommands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from psyche_common.cli_conventions import PROGRAM_SETTINGS
from run_manager.commands.solana_common import (
    EXIT_BAD_ARGUMENT,
    LOCALNET_URL,
    ProgramId,
    Rpc,
    Rpc2,
    TreasurerIndex,
    fail,
    parse_amount,
    parse_pubkey,
    run_rpc,
    signing_keypair,
)

LAMPORTS_DECIMALS = 9
AnyWallet = Annotated[Path | None, typer.Option(
    "--wallet", "-w", "--wallet-private-key-path",
    envvar=["WALLET_PRIVATE_KEY_PATH", "WALLET_PATH"],
    help="Keypair file (or set RAW_WALLET_PRIVATE_KEY).")]
Address = Annotated[str | None, typer.Option(help="Any public key instead of the wallet's.")]
token_app = typer.Typer(**PROGRAM_SETTINGS, help="An SPL reward mint of your own (local or "
                                                   "test clusters): create-mint, mint.")


def _target(wallet: Path | None, address: str | None) -> Any:
    import os

    if address is not None:
        if wallet is not None:
            raise fail("give one of --wallet and --address", EXIT_BAD_ARGUMENT)
        return parse_pubkey(address, "--address")
    if wallet is None and not os.environ.get("RAW_WALLET_PRIVATE_KEY"):
        raise fail("give --wallet (or RAW_WALLET_PRIVATE_KEY) or --address", EXIT_BAD_ARGUMENT)
    return signing_keypair(wallet).pubkey()


def _sol(lamports: int) -> str:
    return f"{lamports / 10**LAMPORTS_DECIMALS:.9f} SOL"


def airdrop(amount: Annotated[str, typer.Argument(help="SOL to request.")] = "1",
            wallet: AnyWallet = None, address: Address = None, rpc: Rpc = LOCALNET_URL,
            rpc_2: Rpc2 = None) -> None:
    """Request SOL from the cluster's faucet (local and test clusters only)."""
    lamports = parse_amount(amount, LAMPORTS_DECIMALS, "amount")
    if lamports == 0:
        raise fail("amount: ask for more than 0 SOL", EXIT_BAD_ARGUMENT)
    target = _target(wallet, address)

    async def work(client: Any) -> int:
        await client.airdrop(target, lamports)
        return int(await client.balance(target))

    balance = run_rpc(rpc, rpc_2, None, work)
    typer.echo(f"airdropped {_sol(lamports)} to {target}; balance {_sol(balance)}")


def balance(wallet: AnyWallet = None, address: Address = None, rpc: Rpc = LOCALNET_URL,
            rpc_2: Rpc2 = None,
            run_id: Annotated[str | None, typer.Option(
                "--run-id", "-r", envvar="RUN_ID",
                help="Also the run's reward token and points.")] = None,
            program_id: ProgramId = None, treasurer_index: TreasurerIndex = None) -> None:
    """Print the SOL balance (and with -r the run's reward token and points)."""
    from psyche_solana.rewards import format_units, reward_status
    from psyche_solana.runs import find_run

    target = _target(wallet, address)

    async def work(client: Any) -> list[str]:
        lamports = int(await client.balance(target))
        lines = [f"{target}: {_sol(lamports)} ({lamports} lamports)"]
        if run_id is None:
            return lines
        status = await reward_status(client, await find_run(client, run_id, treasurer_index),
                                     target)
        if status.mint is None:
            lines.append(f"run {run_id!r}: {status.earned} points earned "
                         "(the run has no reward token)")
            return lines
        held = status.held
        lines += [f"reward token {status.mint}: {format_units(held, status.decimals)} "
                  f"({held} base units)",
                  f"run {run_id!r}: {status.earned} points earned, {status.claimed} claimed, "
                  f"{status.claimable} claimable (1 point = 1 base unit)"]
        return lines

    for line in run_rpc(rpc, rpc_2, program_id, work):
        typer.echo(line)


@token_app.command("create-mint")
def create_mint(wallet: AnyWallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                decimals: Annotated[int, typer.Option(min=0, max=9)] = 6) -> None:
    """Create an SPL token mint; the wallet pays and is its mint authority."""
    from solders.keypair import Keypair

    from psyche_solana import instructions as ix

    payer, mint = signing_keypair(wallet), Keypair()

    async def work(client: Any) -> None:
        rent = await client.minimum_balance(ix.MINT_SIZE)
        await client.send_instructions(ix.create_mint(payer.pubkey(), mint.pubkey(), rent,
                                                      decimals, payer.pubkey()), payer, [mint])

    run_rpc(rpc, rpc_2, None, work)
    typer.echo(f"mint {mint.pubkey()}: {decimals} decimals, authority {payer.pubkey()}")


@token_app.command("mint")
def mint_tokens(mint: Annotated[str, typer.Option(help="The mint (yours: you sign).")],
                amount: Annotated[str, typer.Option(help="In token units, e.g. 1.5.")],
                wallet: AnyWallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                to: Annotated[str | None, typer.Option(
                    help="Owner of the receiving account (default: the wallet).")] = None,
                ) -> None:
    """Mint tokens to an owner's associated token account (created if needed)."""
    from psyche_solana import instructions as ix
    from psyche_solana.runs import mint_decimals

    authority = signing_keypair(wallet)
    token_mint = parse_pubkey(mint, "--mint")
    owner = parse_pubkey(to, "--to") if to else authority.pubkey()

    async def work(client: Any) -> tuple[int, int]:
        decimals = await mint_decimals(client, token_mint)
        base_units = parse_amount(amount, decimals, "--amount")
        account = ix.associated_token_address(owner, token_mint)
        await client.send_instructions([
            ix.create_associated_token_account(authority.pubkey(), owner, token_mint),
            ix.mint_to(token_mint, account, authority.pubkey(), base_units)], authority)
        return base_units, ix.token_amount(await client.account_data(account) or b"")

    minted, held = run_rpc(rpc, rpc_2, None, work)
    typer.echo(f"minted {minted} base units of {token_mint} to {owner}; it holds {held}")


def register(app: typer.Typer) -> None:
    """`wallet airdrop` and `wallet balance` in the run-manager's wallet group, and the
    `token` group."""
    for group in app.registered_groups:
        if group.name == "wallet" and group.typer_instance is not None:
            group.typer_instance.command("airdrop")(airdrop)
            group.typer_instance.command("balance")(balance)
    app.add_typer(token_app, name="token")
