"""The mining pool subcommands (psyche_solana.mining_pool): a delegate raises collateral
for a run from lenders, extracts it to buy compute, then deposits the rewards the run
earned for the lenders to claim in proportion to their deposits.

    pool-create     --index N --collateral-mint M --max-deposit X [--metadata TEXT]
    pool-update     --index N [--max-deposit X] [--freeze | --unfreeze] [--metadata TEXT]
    pool-deposit    --index N --amount X          (a lender; creates its lender account)
    pool-extract    --index N [--amount X]        (the authority; default: the whole vault)
    pool-claimable  --index N --reward-mint M [--amount X]   (deposit rewards, enable claims)
    pool-claim      --index N [--amount X]        (a lender; default: all it may claim now)
    pool-show       --index N [--lender PUBKEY]   (JSON)

Amounts are in token units scaled by the mint's decimals (1.5 of a 6-decimal mint is
1500000 base units). On-chain refusals are printed as one line naming the program, the
error and what to do, and exit 1; bad arguments exit 2.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from run_manager.commands.solana_common import (
    EXIT_BAD_ARGUMENT,
    LOCALNET_URL,
    Rpc,
    Rpc2,
    Wallet,
    fail,
    parse_amount,
    parse_pubkey,
    run_rpc,
    signing_keypair,
    with_websocket_options,
)

POOL_PANEL = "Mining pool"
Index = Annotated[int, typer.Option("--index", min=0, max=2**64 - 1,
                                    help="The pool's index (its PDA is [\"Pool\", index LE]).")]
Metadata = Annotated[str | None, typer.Option(
    help="Free text about the pool, e.g. JSON naming the run (at most 400 bytes of UTF-8).")]
_INSUFFICIENT = ("the wallet's token account holds less than that (see `run-manager wallet "
                 "balance`, or pool-show for the pool's vaults)")


def _metadata(text: str | None) -> bytes | None:
    from psyche_solana.mining_pool import METADATA_MAX

    if text is None:
        return None
    raw = text.encode()
    if len(raw) > METADATA_MAX:
        raise fail(f"--metadata is {len(raw)} bytes of UTF-8, at most {METADATA_MAX}",
                   EXIT_BAD_ARGUMENT)
    return raw


async def _send(rpc: Any, instructions: Sequence[Any], payer: Any) -> None:
    """Send, turning a refusal into one line naming the program and what to do."""
    from psyche_solana import mining_pool as mp
    from psyche_solana.ids import mining_pool_program
    from psyche_solana.rpc import ProgramError

    try:
        await rpc.send_instructions(instructions, payer)
    except ProgramError as error:
        # the innermost program that failed logs first: ours, or one it invoked (a token
        # transfer short of tokens fails in the token program, with that program's code)
        failed = next((line.split()[1] for line in error.logs
                       if line.startswith("Program ") and " failed: " in line), None)
        if error.code is not None and failed == str(mining_pool_program()):
            raise ValueError(f"mining pool program error {error.code}: "
                             f"{mp.describe(error.code)}") from None
        if error.name == "InsufficientFunds":
            raise ValueError(f"token program refused the transfer: InsufficientFunds: "
                             f"{_INSUFFICIENT}") from None
        raise ValueError(f"mining pool transaction refused: {error}") from None


async def _pool(rpc: Any, index: int) -> Any:
    from psyche_solana import mining_pool as mp

    address = mp.pool_address(index)
    data = await rpc.account_data(address)
    if data is None:
        raise ValueError(f"mining pool: no pool with index {index} (at {address}); "
                         "pool-create makes one")
    return mp.decode_pool(data)


async def _decimals(rpc: Any, mint: Any) -> int:
    from psyche_solana.runs import mint_decimals

    return await mint_decimals(rpc, mint)


async def _token_amount(rpc: Any, address: Any) -> int | None:
    from psyche_solana.instructions import token_amount

    data = await rpc.account_data(address)
    return None if data is None else token_amount(data)


def _run(rpc: str, rpc_2: str | None, work: Callable[[Any], Any]) -> Any:
    return run_rpc(rpc, rpc_2, None, work)


def pool_create(index: Index,
                collateral_mint: Annotated[str, typer.Option(help="The SPL mint lenders deposit.")],
                max_deposit: Annotated[str, typer.Option(
                    help="The most collateral the pool takes in all, in token units.")],
                metadata: Metadata = None, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL,
                rpc_2: Rpc2 = None) -> None:
    """Create a mining pool: the wallet becomes its authority."""
    from psyche_solana import mining_pool as mp
    from psyche_solana.instructions import create_associated_token_account

    authority = signing_keypair(wallet)
    mint = parse_pubkey(collateral_mint, "--collateral-mint")
    raw = _metadata(metadata) or b""

    async def work(client: Any) -> int:
        amount = parse_amount(max_deposit, await _decimals(client, mint), "--max-deposit")
        me = authority.pubkey()
        if await client.account_data(mp.pool_address(index)) is not None:
            raise ValueError(f"mining pool: pool {index} exists already (pool-show --index {index})")
        await _send(client, [mp.pool_create(me, me, index, mint, raw),
                             mp.pool_update(me, index, max_deposit=amount),
                             create_associated_token_account(me, me, mint)], authority)
        return amount

    amount = _run(rpc, rpc_2, work)
    typer.echo(f"created mining pool {index} at {_address(index)} (max deposit {amount} base units)")


def _address(index: int) -> str:
    from psyche_solana.mining_pool import pool_address

    return str(pool_address(index))


def pool_update(index: Index,
                max_deposit: Annotated[str | None, typer.Option(
                    help="New maximum total deposit, in token units.")] = None,
                freeze: Annotated[bool | None, typer.Option(
                    "--freeze/--unfreeze", help="Stop (or allow again) deposits, extraction "
                                                "and claims.")] = None,
                metadata: Metadata = None, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL,
                rpc_2: Rpc2 = None) -> None:
    """Change a pool's maximum deposit, freeze or metadata (its authority only)."""
    from psyche_solana import mining_pool as mp

    if max_deposit is None and freeze is None and metadata is None:
        raise fail("nothing to change: give --max-deposit, --freeze/--unfreeze or --metadata",
                   EXIT_BAD_ARGUMENT)
    authority = signing_keypair(wallet)
    raw = _metadata(metadata)

    async def work(client: Any) -> None:
        pool = await _pool(client, index)
        amount = None if max_deposit is None else parse_amount(
            max_deposit, await _decimals(client, pool.collateral_mint), "--max-deposit")
        await _send(client, [mp.pool_update(authority.pubkey(), index, amount, freeze, raw)],
                    authority)

    _run(rpc, rpc_2, work)
    typer.echo(f"updated mining pool {index}")


def pool_deposit(index: Index,
                 amount: Annotated[str, typer.Option(help="Collateral to lend, in token units.")],
                 wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Lend collateral to a pool (creates the wallet's lender account the first time)."""
    from psyche_solana import mining_pool as mp

    user = signing_keypair(wallet)

    async def work(client: Any) -> int:
        pool = await _pool(client, index)
        base = parse_amount(amount, await _decimals(client, pool.collateral_mint), "--amount")
        me = user.pubkey()
        lender = mp.lender_address(mp.pool_address(index), me)
        instructions = [] if await client.account_data(lender) else [mp.lender_create(me, me, index)]
        await _send(client, [*instructions, mp.lender_deposit(me, index, pool.collateral_mint, base)],
                    user)
        return base

    base = _run(rpc, rpc_2, work)
    typer.echo(f"deposited {base} base units into mining pool {index}")


def pool_extract(index: Index,
                 amount: Annotated[str | None, typer.Option(
                     help="Collateral to withdraw, in token units (default: all of it).")] = None,
                 wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Withdraw a pool's collateral to the authority's token account (to buy compute)."""
    from psyche_solana import mining_pool as mp
    from psyche_solana.instructions import associated_token_address, create_associated_token_account

    authority = signing_keypair(wallet)

    async def work(client: Any) -> int:
        pool = await _pool(client, index)
        mint = pool.collateral_mint
        if amount is None:
            base = await _token_amount(client, associated_token_address(mp.pool_address(index), mint)) or 0
        else:
            base = parse_amount(amount, await _decimals(client, mint), "--amount")
        me = authority.pubkey()
        await _send(client, [create_associated_token_account(me, me, mint),
                             mp.pool_extract(me, index, mint, base)], authority)
        return base

    base = _run(rpc, rpc_2, work)
    typer.echo(f"extracted {base} base units from mining pool {index}")


def pool_claimable(index: Index,
                   reward_mint: Annotated[str, typer.Option(help="The mint lenders are paid in.")],
                   amount: Annotated[str, typer.Option(
                       help="Rewards to deposit first from the wallet, in token units.")] = "0",
                   wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Deposit reward tokens into a pool and enable lenders' claims (its authority only)."""
    from psyche_solana import mining_pool as mp
    from psyche_solana.instructions import (
        associated_token_address,
        create_associated_token_account,
        token_transfer_checked,
    )

    authority = signing_keypair(wallet)
    mint = parse_pubkey(reward_mint, "--reward-mint")

    async def work(client: Any) -> int:
        pool = await _pool(client, index)
        decimals = await _decimals(client, mint)
        base = parse_amount(amount, decimals, "--amount")
        me, address = authority.pubkey(), mp.pool_address(index)
        vault = associated_token_address(address, mint)
        instructions = [create_associated_token_account(me, address, mint)]
        if base:
            instructions.append(token_transfer_checked(
                associated_token_address(me, mint), mint, vault, me, base, decimals))
        if not pool.claiming_enabled:
            instructions.append(mp.pool_claimable(me, index, mint))
        elif pool.redeemable_mint != mint:
            raise ValueError(f"mining pool: claims of pool {index} are already enabled in "
                             f"{pool.redeemable_mint}; pass that --reward-mint to add rewards")
        await _send(client, instructions, authority)
        return base

    base = _run(rpc, rpc_2, work)
    typer.echo(f"mining pool {index}: deposited {base} reward base units; claims are enabled")


async def _lender_view(client: Any, index: int, pool: Any, user: Any) -> dict[str, Any]:
    from psyche_solana import mining_pool as mp
    from psyche_solana.instructions import associated_token_address

    address = mp.lender_address(mp.pool_address(index), user)
    data = await client.account_data(address)
    if data is None:
        return {"user": str(user), "address": str(address), "exists": False}
    lender = mp.decode_lender(data)
    held = 0
    if pool.claiming_enabled:
        held = await _token_amount(client, associated_token_address(
            mp.pool_address(index), pool.redeemable_mint)) or 0
    return {"user": str(user), "address": str(address), "exists": True,
            "deposited_collateral_amount": lender.deposited_collateral_amount,
            "claimed_redeemable_amount": lender.claimed_redeemable_amount,
            "claimable_redeemable_amount": mp.claimable_now(pool, lender, held)}


def pool_claim(index: Index,
               amount: Annotated[str | None, typer.Option(
                   help="Rewards to claim, in token units (default: all claimable now).")] = None,
               wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Claim the wallet's share of a pool's rewards."""
    from psyche_solana import mining_pool as mp
    from psyche_solana.instructions import create_associated_token_account

    user = signing_keypair(wallet)

    async def work(client: Any) -> int:
        pool = await _pool(client, index)
        if not pool.claiming_enabled:
            raise ValueError(f"mining pool: claims of pool {index} are not enabled yet "
                             "(its authority runs pool-claimable)")
        view = await _lender_view(client, index, pool, user.pubkey())
        if not view["exists"]:
            raise ValueError(f"mining pool: this wallet never deposited into pool {index}")
        if amount is None:
            base = int(view["claimable_redeemable_amount"])
            if base == 0:
                raise ValueError(f"mining pool: nothing to claim from pool {index} "
                                 "(already claimed? see pool-show --lender)")
        else:
            base = parse_amount(amount, await _decimals(client, pool.redeemable_mint), "--amount")
        me = user.pubkey()
        await _send(client, [create_associated_token_account(me, me, pool.redeemable_mint),
                             mp.lender_claim(me, index, pool.redeemable_mint, base)], user)
        return base

    base = _run(rpc, rpc_2, work)
    typer.echo(f"claimed {base} reward base units from mining pool {index}")


def pool_show(index: Index,
              lender: Annotated[str | None, typer.Option(
                  help="Also show this lender (default: the wallet's, when one is given).")] = None,
              wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Print a pool, its vaults and a lender as JSON."""
    import os

    from psyche_solana import mining_pool as mp
    from psyche_solana.instructions import associated_token_address

    user = parse_pubkey(lender, "--lender") if lender is not None else None
    if user is None and (wallet is not None or os.environ.get("RAW_WALLET_PRIVATE_KEY")):
        user = signing_keypair(wallet).pubkey()

    async def work(client: Any) -> dict[str, Any]:
        pool = await _pool(client, index)
        address = mp.pool_address(index)
        collateral = associated_token_address(address, pool.collateral_mint)
        shown: dict[str, Any] = {
            "address": str(address), **pool.to_json(),
            "collateral_vault": {"address": str(collateral),
                                 "amount": await _token_amount(client, collateral)},
            "redeemable_vault": None, "lender": None}
        if pool.claiming_enabled:
            redeemable = associated_token_address(address, pool.redeemable_mint)
            shown["redeemable_vault"] = {"address": str(redeemable),
                                         "amount": await _token_amount(client, redeemable)}
        if user is not None:
            shown["lender"] = await _lender_view(client, index, pool, user)
        return shown

    typer.echo(json.dumps(_run(rpc, rpc_2, work), indent=2))


COMMANDS: dict[str, Callable[..., None]] = {
    "pool-create": pool_create, "pool-update": pool_update, "pool-deposit": pool_deposit,
    "pool-extract": pool_extract, "pool-claimable": pool_claimable, "pool-claim": pool_claim,
    "pool-show": pool_show,
}


def register(app: typer.Typer) -> None:
    for name, function in COMMANDS.items():
        app.command(name, rich_help_panel=POOL_PANEL)(with_websocket_options(function))
