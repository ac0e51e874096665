"""The Solana subcommands for join authorizations: grant, delegate, delete, check."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from run_manager.commands.solana_common import (
    EXIT_BAD_ARGUMENT,
    EXIT_FAILED,
    LOCALNET_URL,
    Address,
    ProgramId,
    Rpc,
    Rpc2,
    RunId,
    Wallet,
    fail,
    parse_address,
    parse_pubkey,
    run_rpc,
    signing_keypair,
)


def join_authorization_create(wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                              program_id: ProgramId = None,
                              authorizer: Annotated[str | None, typer.Option(
                                  help="The grantee key.")] = None,
                              permissionless: Annotated[bool, typer.Option(
                                  help="Anyone may join (grantee = 1111...1).")] = False) -> None:
    """Authorize a key (or everyone) to join the runs whose join authority is the wallet."""
    from solders.pubkey import Pubkey

    from psyche_solana.runs import authorize

    if (authorizer is None) == (not permissionless):
        raise fail("give exactly one of --authorizer and --permissionless", EXIT_BAD_ARGUMENT)
    grantee = Pubkey.default() if permissionless else parse_pubkey(authorizer or "", "--authorizer")
    grantor = signing_keypair(wallet)

    def already(active: bool) -> typer.Exit:
        return fail(f"an authorization from {grantor.pubkey()} for {grantee} already exists "
                     f"({'active' if active else 'inactive'}): see join-authorization-read, "
                     "or join-authorization-delete it first")

    async def work(client: Any) -> Any:
        from psyche_solana.rpc import ProgramError
        from psyche_solana.runs import read_authorization

        existing = await read_authorization(client, grantor.pubkey(), grantee)
        if existing is not None:
            raise already(existing.active)
        try:
            return await authorize(client, grantor, grantee)
        except ProgramError as error:
            # created between our read and our transaction: the program refuses a second
            if error.name == "AlreadyInitialized":
                raise already(True) from None
            raise

    address = run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"authorization {address}: grantor {grantor.pubkey()} grantee {grantee}")


def join_authorization_read(join_authority: Annotated[str, typer.Option(
                                help="The grantor (the run's join authority).")],
                            rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                            program_id: ProgramId = None,
                            authorizer: Annotated[str | None, typer.Option(
                                help="The grantee key (default: the permissionless "
                                     "one, 1111...1).")] = None) -> None:
    """Print a join authorization as JSON (exits 1 if there is none)."""
    from solders.pubkey import Pubkey

    from psyche_solana import instructions as ix
    from psyche_solana.runs import read_authorization

    grantor = parse_pubkey(join_authority, "--join-authority")
    grantee = parse_pubkey(authorizer, "--authorizer") if authorizer else Pubkey.default()
    found = run_rpc(rpc, rpc_2, program_id, lambda c: read_authorization(c, grantor, grantee))
    if found is None:
        raise fail(f"no authorization from {grantor} for {grantee}")
    typer.echo(json.dumps({
        "address": str(ix.authorization_address(grantor, grantee)),
        "grantor": str(found.grantor), "grantee": str(found.grantee),
        "permissionless": found.grantee == Pubkey.default(), "active": found.active,
        "scope": found.scope.decode("utf-8", "replace"),
        "grantor_update_unix_timestamp": found.grantor_update_unix_timestamp,
        "delegates": [str(key) for key in found.delegates]}, indent=2))


def join_authorization_delegate(join_authority: Annotated[str, typer.Option()],
                                wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                                program_id: ProgramId = None,
                                delegates_clear: Annotated[bool, typer.Option()] = False,
                                delegates_added: Annotated[list[str] | None, typer.Option(
                                    "--delegates-added", "--delegate-added",
                                    help="A key to add (repeat the flag for more); "
                                         "--delegate-added is Psyche's alias.")] = None) -> None:
    """As a grantee, let other keys (e.g. each machine's) join on your authorization."""
    from psyche_solana import instructions as ix

    grantee = signing_keypair(wallet)
    added = [parse_pubkey(k, "--delegates-added") for k in delegates_added or []]
    address = ix.authorization_address(parse_pubkey(join_authority, "--join-authority"), grantee.pubkey())

    async def work(client: Any) -> None:
        await client.send_instructions([ix.authorization_grantee_update(
            grantee.pubkey(), address, delegates_clear, added)], grantee)

    run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"authorization {address}: {len(added)} delegate(s) added"
               + (" after clearing" if delegates_clear else ""))


def join_authorization_delete(authorizer: Annotated[str, typer.Option(
                                  help="The grantee key (11111111111111111111111111111111 "
                                       "for a permissionless one).")],
                              wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                              program_id: ProgramId = None) -> None:
    """Deactivate and close an authorization you granted (rent back to the wallet)."""
    from psyche_solana import instructions as ix

    grantor = signing_keypair(wallet)
    address = ix.authorization_address(grantor.pubkey(), parse_pubkey(authorizer, "--authorizer"))

    async def work(client: Any) -> None:
        await client.send_instructions([
            ix.authorization_grantor_update(grantor.pubkey(), address, False),
            ix.authorization_close(grantor.pubkey(), address, grantor.pubkey())], grantor)

    run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"authorization {address} deleted")


def can_join(run_id: RunId, address: Address,
             rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
             program_id: ProgramId = None, authorizer: Annotated[str | None, typer.Option()] = None) -> None:
    """Whether an address may join a run; exits 1 if not."""
    from psyche_solana.runs import can_join as check
    from psyche_solana.runs import find_run

    user = parse_address(address)
    grantee = parse_pubkey(authorizer, "--authorizer") if authorizer else None

    async def work(client: Any) -> tuple[bool, str]:
        return await check(client, await find_run(client, run_id), user, grantee)

    allowed, reason = run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"{'yes' if allowed else 'no'}: {reason}")
    if not allowed:
        raise typer.Exit(EXIT_FAILED)
    # As Psyche's can-join: the model is fetched before the first warm-up, not in it.
    from shlex import quote

    typer.echo(f"fetch the model before joining: psyche-client predownload --rpc {quote(rpc)} "
               f"--run-id {quote(run_id)} --model")
