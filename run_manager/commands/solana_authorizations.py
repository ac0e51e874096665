"""The Solana subcommands for join authorizations: grant, delegate, delete, check."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from run_manager.commands.solana_common import (
    EXIT_BAD_ARGUMENT,
    EXIT_FAILED,
    LOCALNET_URL,
    Rpc,
    Rpc2,
    RunId,
    Wallet,
    _fail,
    _keypair,
    _pubkey,
    _run,
)


def join_authorization_create(wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                              authorizer: Annotated[str | None, typer.Option(
                                  help="The grantee key.")] = None,
                              permissionless: Annotated[bool, typer.Option(
                                  help="Anyone may join (grantee = 1111...1).")] = False) -> None:
    """Authorize a key (or everyone) to join the runs whose join authority is the wallet."""
    from solders.pubkey import Pubkey

    from psyche_solana.runs import authorize

    if (authorizer is None) == (not permissionless):
        raise _fail("give exactly one of --authorizer and --permissionless", EXIT_BAD_ARGUMENT)
    grantee = Pubkey.default() if permissionless else _pubkey(authorizer or "", "--authorizer")
    grantor = _keypair(wallet)
    address = _run(rpc, rpc_2, lambda c: authorize(c, grantor, grantee))
    typer.echo(f"authorization {address}: grantor {grantor.pubkey()} grantee {grantee}")


def join_authorization_delegate(join_authority: Annotated[str, typer.Option()],
                                wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                                delegates_clear: Annotated[bool, typer.Option()] = False,
                                delegates_added: Annotated[list[str] | None, typer.Option()] = None) -> None:
    """As a grantee, let other keys (e.g. each machine's) join on your authorization."""
    from psyche_solana import instructions as ix

    grantee = _keypair(wallet)
    added = [_pubkey(k, "--delegates-added") for k in delegates_added or []]
    address = ix.authorization_address(_pubkey(join_authority, "--join-authority"), grantee.pubkey())

    async def work(client: Any) -> None:
        await client.send_instructions([ix.authorization_grantee_update(
            grantee.pubkey(), address, delegates_clear, added)], grantee)

    _run(rpc, rpc_2, work)
    typer.echo(f"authorization {address}: {len(added)} delegate(s) added"
               + (" after clearing" if delegates_clear else ""))


def join_authorization_delete(authorizer: Annotated[str, typer.Option(
                                  help="The grantee key (11111111111111111111111111111111 "
                                       "for a permissionless one).")],
                              wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Deactivate and close an authorization you granted (rent back to the wallet)."""
    from psyche_solana import instructions as ix

    grantor = _keypair(wallet)
    address = ix.authorization_address(grantor.pubkey(), _pubkey(authorizer, "--authorizer"))

    async def work(client: Any) -> None:
        await client.send_instructions([
            ix.authorization_grantor_update(grantor.pubkey(), address, False),
            ix.authorization_close(grantor.pubkey(), address, grantor.pubkey())], grantor)

    _run(rpc, rpc_2, work)
    typer.echo(f"authorization {address} deleted")


def can_join(run_id: RunId, address: Annotated[str, typer.Option()],
             rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None, authorizer: Annotated[str | None, typer.Option()] = None) -> None:
    """Whether an address may join a run; exits 1 if not."""
    from psyche_solana.runs import can_join as check
    from psyche_solana.runs import find_run

    user = _pubkey(address, "--address")
    grantee = _pubkey(authorizer, "--authorizer") if authorizer else None

    async def work(client: Any) -> tuple[bool, str]:
        return await check(client, await find_run(client, run_id), user, grantee)

    allowed, reason = _run(rpc, rpc_2, work)
    typer.echo(f"{'yes' if allowed else 'no'}: {reason}")
    if not allowed:
        raise typer.Exit(EXIT_FAILED)
