"""The run-manager's Solana subcommands (Psyche's names, reference §10), over JSON-RPC
to any cluster running our programs — by default the embedded `psyche-localnet`.

Common options: `--rpc` (env RPC; default the local validator, `psyche-localnet`, on
127.0.0.1:8899), `--rpc-2` (env RPC_2, the fallback endpoint), and for
signing commands `--wallet-private-key-path` (env WALLET_PRIVATE_KEY_PATH) or
RAW_WALLET_PRIVATE_KEY (a JSON array of 64 bytes). Every on-chain failure is printed as
its error's name and meaning (e.g. `NotAuthorized: no active join authorization ...`)
and the command exits 1; bad arguments exit 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

SOLANA_PANEL = "Solana runs"
EXIT_FAILED = 1
EXIT_BAD_ARGUMENT = 2
T = TypeVar("T")

LOCALNET_URL = "http://127.0.0.1:8899"  # psyche-localnet's default address
Rpc = Annotated[str, typer.Option("--rpc", envvar="RPC", help="Solana JSON-RPC URL.")]
Rpc2 = Annotated[str | None, typer.Option("--rpc-2", envvar="RPC_2", help="Fallback RPC URL.")]
RunId = Annotated[str, typer.Option("--run-id", "-r", envvar="RUN_ID", help="The run id.")]
Wallet = Annotated[Path | None, typer.Option(
    "--wallet-private-key-path", envvar=["WALLET_PRIVATE_KEY_PATH", "WALLET_PATH"],
    help="Keypair file (or set RAW_WALLET_PRIVATE_KEY).")]
TreasurerIndex = Annotated[int | None, typer.Option(
    "--treasurer-index", help="Treasurer run index (default: from the run id).")]


def _fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    typer.echo(f"run-manager: {message}", err=True)
    return typer.Exit(code)


def _keypair(path: Path | None) -> Any:
    from solders.keypair import Keypair

    from run_manager.wallet import WalletError, load_keypair_bytes

    raw = os.environ.get("RAW_WALLET_PRIVATE_KEY")
    try:
        if path is not None:
            return Keypair.from_bytes(load_keypair_bytes(path))
        if raw:
            return Keypair.from_json(raw.strip())
    except (WalletError, ValueError) as error:
        raise _fail(f"wallet: {error}", EXIT_BAD_ARGUMENT) from None
    raise _fail("a wallet is needed: --wallet-private-key-path or RAW_WALLET_PRIVATE_KEY",
                EXIT_BAD_ARGUMENT)


def _pubkey(text: str, what: str) -> Any:
    from solders.pubkey import Pubkey

    try:
        return Pubkey.from_string(text)
    except ValueError:
        raise _fail(f"{what} is not a base-58 public key: {text!r}", EXIT_BAD_ARGUMENT) from None


def _run(rpc: str, rpc_2: str | None, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(SolanaRpc)`, turning every failure into a clear message."""
    from psyche_solana.accounts import AccountDecodeError
    from psyche_solana.rpc import RpcError, SolanaRpc
    from psyche_solana.runs import RunNotFound

    async def main() -> T:
        async with SolanaRpc([rpc, rpc_2]) as client:
            return await work(client)

    try:
        return asyncio.run(main())
    except (RpcError, RunNotFound, AccountDecodeError, ValueError) as error:
        raise _fail(str(error)) from None


def _find(run_id: str, index: int | None) -> Callable[[Any], Awaitable[Any]]:
    from psyche_solana.runs import find_run

    return lambda client: find_run(client, run_id, index)


def create_run(run_id: RunId,
               client_version: Annotated[str, typer.Option("--client-version", "-c")],
               wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None, treasurer_index: TreasurerIndex = None,
               treasurer_collateral_mint: Annotated[str | None, typer.Option(
                   help="Reward token mint: creates the run through the treasurer.")] = None,
               join_authority: Annotated[str | None, typer.Option(
                   help="Who grants join authorizations (default: the wallet).")] = None) -> None:
    """Create a run (paused until update-config and set-paused --resume)."""
    from psyche_solana.runs import create_run as create

    payer = _keypair(wallet)
    mint = _pubkey(treasurer_collateral_mint, "--treasurer-collateral-mint") \
        if treasurer_collateral_mint else None
    join = _pubkey(join_authority, "--join-authority") if join_authority else None
    address = _run(rpc, rpc_2, lambda c: create(c, payer, run_id, client_version, join,
                                                 treasurer_index, mint))
    typer.echo(f"created run {run_id!r}: coordinator account {address}")


def update_config(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                  treasurer_index: TreasurerIndex = None,
                  config_path: Annotated[Path | None, typer.Option(
                      help="state.toml with [config] and [model.LLM].")] = None,
                  client_version: Annotated[str | None, typer.Option()] = None) -> None:
    """Set a paused run's config and model (from a state.toml) and/or client version."""
    from coordinator import ConfigError, load_state_file
    from psyche_solana.runs import admin, find_run, update_instructions

    authority = _keypair(wallet)
    try:
        state_file = load_state_file(config_path) if config_path else None
    except ConfigError as error:
        raise _fail(f"invalid config:\n{error}", EXIT_BAD_ARGUMENT) from None
    if state_file is None and client_version is None:
        raise _fail("nothing to update: give --config-path and/or --client-version",
                    EXIT_BAD_ARGUMENT)

    async def work(client: Any) -> None:
        run = await find_run(client, run_id, treasurer_index)
        await admin(client, run, authority, update_instructions(
            run, _authority_of(run, authority), state_file, client_version))

    _run(rpc, rpc_2, work)
    typer.echo(f"updated run {run_id!r}")


def _authority_of(run: Any, authority: Any) -> Any:
    """The key the coordinator sees as signer: the treasurer's Run PDA for treasurer runs."""
    from psyche_solana import instructions as ix

    if run.treasurer_index is not None:
        return ix.treasurer_run_address(run.treasurer_index)
    return authority.pubkey()


def set_paused(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
               treasurer_index: TreasurerIndex = None,
               resume: Annotated[bool, typer.Option("--resume", help="Resume instead.")] = False) -> None:
    """Pause a run (after the current epoch if one is running), or resume it."""
    from psyche_solana import instructions as ix
    from psyche_solana.runs import admin, find_run

    authority = _keypair(wallet)

    async def work(client: Any) -> None:
        run = await find_run(client, run_id, treasurer_index)
        await admin(client, run, authority, [
            ix.set_paused(run.address, _authority_of(run, authority), not resume)])

    _run(rpc, rpc_2, work)
    typer.echo(f"run {run_id!r} {'resumed' if resume else 'paused'}")


def set_future_epoch_rates(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                           treasurer_index: TreasurerIndex = None,
                           earning_rate_total_shared: Annotated[int | None, typer.Option()] = None,
                           slashing_rate_per_client: Annotated[int | None, typer.Option()] = None) -> None:
    """Set the points shared per epoch (and slashing) from the next epoch on."""
    from psyche_solana import instructions as ix
    from psyche_solana.runs import admin, find_run

    authority = _keypair(wallet)

    async def work(client: Any) -> None:
        run = await find_run(client, run_id, treasurer_index)
        await admin(client, run, authority, [ix.set_future_epoch_rates(
            run.address, _authority_of(run, authority), earning_rate_total_shared,
            slashing_rate_per_client)])

    _run(rpc, rpc_2, work)
    typer.echo(f"future epoch rates of {run_id!r} set")


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


def treasurer_top_up_rewards(run_id: RunId,
                             collateral_amount: Annotated[float, typer.Option(
                                 help="In token units (scaled by the mint's decimals).")],
                             wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                             treasurer_index: TreasurerIndex = None) -> None:
    """Add reward tokens to a treasurer run's vault."""
    from psyche_solana.runs import find_run, mint_decimals, top_up

    payer = _keypair(wallet)

    async def work(client: Any) -> int:
        run = await find_run(client, run_id, treasurer_index)
        if run.treasurer is None:
            raise ValueError(f"run {run_id!r} has no treasurer")
        decimals = await mint_decimals(client, run.treasurer.collateral_mint)
        return await top_up(client, run, payer, round(collateral_amount * 10**decimals))

    amount = _run(rpc, rpc_2, work)
    typer.echo(f"topped up {run_id!r} with {amount} base units")


def treasurer_claim_rewards(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                            treasurer_index: TreasurerIndex = None,
                            points: Annotated[int | None, typer.Option(
                                help="Default: every unclaimed point.")] = None) -> None:
    """Claim the reward tokens for your earned points (1 base unit per point)."""
    from psyche_solana.runs import claim, find_run

    user = _keypair(wallet)

    async def work(client: Any) -> int:
        return await claim(client, await find_run(client, run_id, treasurer_index), user, points)

    amount = _run(rpc, rpc_2, work)
    typer.echo(f"claimed {amount} points = {amount} base units")


def json_dump_run(run_id: RunId, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                  treasurer_index: TreasurerIndex = None) -> None:
    """Print a run's on-chain state as JSON."""
    from psyche_solana.dump import run_json

    run = _run(rpc, rpc_2, _find(run_id, treasurer_index))
    typer.echo(json.dumps(run_json(run), indent=2))


def json_dump_user(run_id: RunId, address: Annotated[str, typer.Option()],
                   rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None, treasurer_index: TreasurerIndex = None) -> None:
    """Print one user's state in a run as JSON."""
    from psyche_solana import instructions as ix
    from psyche_solana.accounts import decode_participant
    from psyche_solana.dump import user_json
    from psyche_solana.runs import find_run

    user = _pubkey(address, "--address")

    async def work(client: Any) -> dict[str, Any]:
        run = await find_run(client, run_id, treasurer_index)
        participant = None
        if run.treasurer_index is not None:
            data = await client.account_data(ix.participant_address(
                ix.treasurer_run_address(run.treasurer_index), user))
            participant = decode_participant(data) if data else None
        return user_json(run, user, await client.balance(user), participant)

    typer.echo(json.dumps(_run(rpc, rpc_2, work), indent=2))


def list_runs(rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """List the runs of the coordinator program."""
    from psyche_solana.runs import list_runs as runs

    found = _run(rpc, rpc_2, runs)
    for address, account in found:
        step = account.state.progress.step if account.state else "-"
        typer.echo(f"{account.run_id:<32} {account.run_state.name:<18} step {step:<6} "
                   f"clients {len(account.registry):<4} {address}")
    if not found:
        typer.echo("no runs")


def tick(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
         ms_interval: Annotated[int, typer.Option()] = 1000,
         count: Annotated[int | None, typer.Option(help="Default: until Ctrl+C.")] = None) -> None:
    """Tick a run's coordinator periodically (anyone may)."""
    from psyche_solana import instructions as ix
    from psyche_solana.rpc import ProgramError
    from psyche_solana.runs import find_run

    payer = _keypair(wallet)

    async def work(client: Any) -> int:
        run = await find_run(client, run_id)
        sent, started = 0, time.monotonic()
        while count is None or sent < count:
            try:
                await client.send_instructions([ix.tick(run.address)], payer)
            except ProgramError as error:
                typer.echo(f"tick: {error}", err=True)
            sent += 1
            await asyncio.sleep(max(0.0, started + sent * ms_interval / 1000 - time.monotonic()))
        return sent

    typer.echo(f"sent {_run(rpc, rpc_2, work)} ticks")


def _unsupported(name: str, why: str) -> Callable[[typer.Context], None]:
    def command(ctx: typer.Context) -> None:
        typer.echo(f"run-manager {name}: {why}", err=True)
        raise typer.Exit(EXIT_BAD_ARGUMENT)

    command.__name__ = name.replace("-", "_")
    return command


COMMANDS: dict[str, Callable[..., None]] = {
    "create-run": create_run, "update-config": update_config, "set-paused": set_paused,
    "set-future-epoch-rates": set_future_epoch_rates,
    "join-authorization-create": join_authorization_create,
    "join-authorization-delegate": join_authorization_delegate,
    "join-authorization-delete": join_authorization_delete, "can-join": can_join,
    "treasurer-top-up-rewards": treasurer_top_up_rewards,
    "treasurer-claim-rewards": treasurer_claim_rewards, "json-dump-run": json_dump_run,
    "json-dump-user": json_dump_user, "list-runs": list_runs, "tick": tick,
}
# Kept for the command tree's shape; not part of this backend yet.
UNSUPPORTED = {
    "close-run": "closing runs is not supported by our coordinator program yet",
    "checkpoint": "checkpoints are reported by the run's clients (the coordinator requires "
                  "the sender to be a client of the epoch)",
    "join-authorization-read": "use can-join, or json-dump-user, to inspect authorizations",
}
SOLANA_COMMANDS = {name: (fn.__doc__ or "").strip().splitlines()[0] for name, fn in COMMANDS.items()}


def register(app: typer.Typer) -> None:
    for name, function in COMMANDS.items():
        app.command(name, rich_help_panel=SOLANA_PANEL)(function)
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    for name, why in UNSUPPORTED.items():
        app.command(name, help=why, rich_help_panel=SOLANA_PANEL,
                    context_settings=settings)(_unsupported(name, why))


class SolanaCoordinatorSource:
    """A run_manager `CoordinatorSource` for a run on Solana: the client version comes from
    the coordinator account, the snapshot (for the TUI) is the decoded on-chain state.

    Wiring (run_manager/runner.py): when the env file sets RPC (and RUN_ID), use
    `SolanaCoordinatorSource([RPC, RPC_2], RUN_ID)` where the TCP source is used today.
    """

    def __init__(self, rpc_urls: list[str | None], run_id: str) -> None:
        from psyche_solana.rpc import SolanaRpc

        self.run_id = run_id
        self.rpc = SolanaRpc(rpc_urls, retries=2)
        self.address: Any = None

    async def _account(self) -> Any:
        from psyche_solana.accounts import AccountDecodeError, decode_coordinator
        from psyche_solana.rpc import RpcError
        from psyche_solana.runs import RunNotFound, find_run
        from run_manager.sources import CoordinatorUnavailable

        try:
            if self.address is None:
                run = await find_run(self.rpc, self.run_id)
                self.address = run.address
                return run.account
            data = await self.rpc.account_data(self.address)
            if data is None:
                raise RunNotFound(f"the account of run {self.run_id!r} is gone")
            return decode_coordinator(data)
        except (RpcError, RunNotFound, AccountDecodeError) as error:
            raise CoordinatorUnavailable(f"run {self.run_id!r} on Solana: {error}") from None

    async def client_version(self) -> str:
        return str((await self._account()).client_version)

    async def snapshot(self) -> Any:
        from run_manager.sources.tcp_coordinator import ObservedState, build_snapshot

        account = await self._account()
        if account.state is None:
            return None
        return build_snapshot(ObservedState(account.state, int(time.time()), time.monotonic(), 0))

    async def close(self) -> None:
        await self.rpc.close()
