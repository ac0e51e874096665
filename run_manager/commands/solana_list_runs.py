"""`list-runs`: the runs this wallet can join, as Psyche's run-manager lists them.

Psyche (tools/rust-tools/run-manager/src/main.rs `list_runs`, docker/coordinator_client.rs
`RunInfo::format_table`): with `--env-file` its RPC, wallet and AUTHORIZER are used; the
runs are those run_manager.discovery picks from (running, an active join authorization
for the wallet, only join authority KEY with `--authorizer`), printed as a table with a
header: run-id, state, clients, epoch time, time left. `--all` lists every run of the
program in the same table, whoever may join it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from run_manager.commands.solana_common import (
    EXIT_BAD_ARGUMENT,
    LOCALNET_URL,
    ProgramId,
    Rpc,
    Rpc2,
    Wallet,
    fail,
    parse_pubkey,
    run_rpc,
    signing_keypair,
)

HEADERS = ("run-id", "state", "clients", "epoch time", "time left")
_NO_CLIENT_COUNT = ("Paused", "Uninitialized", "Finished")


def duration(seconds: int) -> str:
    """Psyche's `format_duration_secs`: `1h 2m 3s`, zero parts left out (`0s` for 0)."""
    hours, rest = divmod(max(0, seconds), 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h"] if hours else []
    parts += [f"{minutes}m"] if minutes else []
    parts += [f"{secs}s"] if secs or not parts else []
    return " ".join(parts)


def row(account: Any, now_s: int) -> tuple[str, str, str, str, str]:
    """One run's cells, as Psyche's RunInfo shows them."""
    state = account.run_state.name
    coordinator = account.state
    clients, epoch_time, start = "-", 0, 0
    if coordinator is not None:
        epoch_time = int(coordinator.config.epoch_time)
        start = int(coordinator.epoch_state.start_timestamp)
        count = len(coordinator.epoch_state.clients)
        wanted = int(coordinator.config.min_clients)
        if state not in _NO_CLIENT_COUNT:
            clients = f"{count}/{wanted} waiting" if count < wanted else f"{count} training"
    if state in (*_NO_CLIENT_COUNT, "WaitingForMembers") or start == 0:
        left = "-"
    else:
        elapsed = max(0, now_s - start)
        left = "overrun" if elapsed >= epoch_time else duration(epoch_time - elapsed)
    return account.run_id, state, clients, duration(epoch_time), left


def table(rows: list[tuple[str, str, str, str, str]]) -> list[str]:
    """The header and the rows, each column as wide as its widest cell."""
    widths = [max(len(cells[i]) for cells in [HEADERS, *rows]) for i in range(4)]

    def line(cells: tuple[str, ...]) -> str:
        return "  " + "   ".join([*(c.ljust(w) for c, w in zip(cells, widths, strict=False)),
                                  cells[4]])
    return [line(HEADERS), *(line(cells) for cells in rows)]


def list_runs(
    rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None, program_id: ProgramId = None,
    wallet: Wallet = None,
    env_file: Annotated[Path | None, typer.Option(
        "--env-file", help="A run-manager env file: its RPC, RPC_2, RPC_3, wallet and "
                           "AUTHORIZER are used (as Psyche's list-runs does).")] = None,
    authorizer: Annotated[str | None, typer.Option(
        "--authorizer", help="Only the runs whose join authority is this key.")] = None,
    all_runs: Annotated[bool, typer.Option(
        "--all", help="Every run of the program, whoever may join it (no wallet needed).")
    ] = False,
) -> None:
    """List the runs this wallet can join (a table), or with --all every run.

    --authorizer filters both lists by join authority."""
    import os

    from run_manager.discovery import find_joinable_runs
    from run_manager.settings import read_env_file

    rpcs: list[str | None] = [rpc, rpc_2, None]
    delegate_text = os.environ.get("AUTHORIZER") or None
    if env_file is not None:
        if not env_file.is_file():
            raise fail(f"--env-file {env_file}: no such file", EXIT_BAD_ARGUMENT)
        try:
            values = read_env_file(env_file)
        except (OSError, ValueError) as error:
            raise fail(f"--env-file {env_file}: {error}", EXIT_BAD_ARGUMENT) from None
        rpcs = [values.get("RPC", rpc), values.get("RPC_2", rpc_2), values.get("RPC_3")]
        delegate_text = values.get("AUTHORIZER", delegate_text)
        if wallet is None and values.get("WALLET_PRIVATE_KEY_PATH", values.get("WALLET_PATH")):
            wallet = Path(values.get("WALLET_PRIVATE_KEY_PATH") or values["WALLET_PATH"])
        if "RAW_WALLET_PRIVATE_KEY" in values:
            os.environ["RAW_WALLET_PRIVATE_KEY"] = values["RAW_WALLET_PRIVATE_KEY"]
    authority = parse_pubkey(authorizer, "--authorizer") if authorizer else None
    delegate = parse_pubkey(delegate_text, "AUTHORIZER") if delegate_text else None
    if all_runs:
        every_run(rpcs, program_id, authority)
        return
    if wallet is None and not os.environ.get("RAW_WALLET_PRIVATE_KEY"):
        raise fail("list-runs lists the runs a wallet can join: give -w/--wallet (or "
                   "RAW_WALLET_PRIVATE_KEY, or --env-file), or --all for every run",
                   EXIT_BAD_ARGUMENT)
    user = signing_keypair(wallet).pubkey()

    async def work(client: Any) -> list[Any]:
        from psyche_solana.runs import list_runs as runs

        by_id = {account.run_id: account for _, account in await runs(client)}
        joinable = await find_joinable_runs(client, user, authority, delegate)
        return [by_id[run.run_id] for run in joinable if run.run_id in by_id]

    shown = run_rpc(rpcs[0] or rpc, rpcs[1], program_id, work, rpcs[2])
    if not shown:
        typer.echo(f"No available runs to join for wallet {user}")
        return
    now_s = int(time.time())
    typer.echo(f"Found {len(shown)} joinable run(s):")
    for line in table([row(account, now_s) for account in shown]):
        typer.echo(line)


def every_run(rpcs: list[str | None], program_id: str | None, authority: Any) -> None:
    """--all: one line per run of the program (id, state, step, clients, address, name)."""
    from psyche_solana.run_metadata import metadata_of_runs
    from psyche_solana.runs import list_runs as runs

    async def work(client: Any) -> tuple[list[tuple[Any, Any]], dict[Any, Any]]:
        found = [(address, account) for address, account in await runs(client)
                 if authority is None or account.join_authority == authority]
        return found, await metadata_of_runs(client, [address for address, _ in found])

    found, metadata = run_rpc(rpcs[0] or LOCALNET_URL, rpcs[1], program_id, work, rpcs[2])
    for address, account in found:
        step = account.state.progress.step if account.state else "-"
        name = metadata[address].name if address in metadata else ""
        typer.echo(f"{account.run_id:<32} {account.run_state.name:<18} step {step:<6} "
                   f"clients {len(account.registry):<4} {address}" + (f"  {name}" if name else ""))
    if not found:
        typer.echo("no runs")
