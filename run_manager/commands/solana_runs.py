"""The Solana subcommands that create, configure, pause, inspect and tick a run."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from run_manager.commands.solana_common import (
    EXIT_BAD_ARGUMENT,
    LOCALNET_URL,
    Address,
    ProgramId,
    Rpc,
    Rpc2,
    RunId,
    TreasurerIndex,
    Wallet,
    fail,
    parse_address,
    parse_amount,
    parse_pubkey,
    run_rpc,
    signing_keypair,
)

# Psyche's RunMetadata flags; a flag left out keeps the run's current value
MetadataName = Annotated[str | None, typer.Option(
    "--name", help="The run's name (metadata, at most 64 bytes of UTF-8).")]
MetadataDescription = Annotated[str | None, typer.Option(
    "--description", help="Its description (metadata, at most 280 bytes).")]
MetadataNumber = Annotated[int | None, typer.Option(help="Metadata (0 to 2^64 - 1).")]


def _find(run_id: str, index: int | None) -> Callable[[Any], Awaitable[Any]]:
    from psyche_solana.runs import find_run

    return lambda client: find_run(client, run_id, index)


def create_run(run_id: RunId,
               client_version: Annotated[str, typer.Option(
                   "--client-version", "-c",
                   help="The client image version run-managers start for this run.")],
               wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
               program_id: ProgramId = None, treasurer_index: TreasurerIndex = None,
               treasurer_collateral_mint: Annotated[str | None, typer.Option(
                   help="Reward token mint: creates the run through the treasurer.")] = None,
               join_authority: Annotated[str | None, typer.Option(
                   help="Who grants join authorizations (default: the wallet).")] = None) -> None:
    """Create a run (paused until update-config and set-paused --resume)."""
    from psyche_solana.program_failures import run_rent_shortfall
    from psyche_solana.rpc import ProgramError
    from psyche_solana.runs import create_run as create

    payer = signing_keypair(wallet)
    mint = parse_pubkey(treasurer_collateral_mint, "--treasurer-collateral-mint") \
        if treasurer_collateral_mint else None
    join = parse_pubkey(join_authority, "--join-authority") if join_authority else None

    async def work(client: Any) -> Any:
        try:
            return await create(client, payer, run_id, client_version, join, treasurer_index, mint)
        except ProgramError as error:
            if error.name != "ResultWithNegativeLamports":
                raise
            # the System program's words name one transfer: say what a whole run costs
            raise ValueError(await run_rent_shortfall(client, payer.pubkey())) from None

    address = run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"created run {run_id!r}: coordinator account {address}")


def update_config(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                  program_id: ProgramId = None,
                  treasurer_index: TreasurerIndex = None,
                  config_path: Annotated[Path | None, typer.Option(
                      help="TOML with [config] and [model.LLM] (a state.toml or Psyche's "
                           "solana-test configs).")] = None,
                  client_version: Annotated[str | None, typer.Option(
                      help="The client image version run-managers start for this run.")] = None,
                  restart_from_step: Annotated[int | None, typer.Option(
                      min=1, envvar="RESTART_FROM_STEP",
                      help="Set the run's step (and its data index, replaying the batch-size "
                           "ramp) to this one, as Psyche's does.")] = None,
                  switch_to_hub: Annotated[bool, typer.Option(
                      envvar="SWITCH_TO_HUB",
                      help="A P2P or Dummy checkpoint becomes the Hub one of the same "
                           "repository: the next epoch loads the stored model.")] = False,
                  name: MetadataName = None, description: MetadataDescription = None,
                  num_parameters: MetadataNumber = None, vocab_size: MetadataNumber = None,
                  ) -> None:
    """Set a paused run's config and model (from a TOML file), client version, step
    (--restart-from-step) and checkpoint source (--switch-to-hub); its metadata at any
    time."""
    from coordinator import ConfigError, data_index_for_step
    from psyche_solana import instructions as ix
    from psyche_solana.run_metadata import RunMetadata
    from psyche_solana.runs import admin, find_run
    from run_manager.commands.solana_config import load_run_config

    metadata_flags = {"name": name, "description": description,
                      "num_parameters": num_parameters, "vocab_size": vocab_size}
    metadata_given = {key: value for key, value in metadata_flags.items() if value is not None}
    if problems := RunMetadata(**metadata_given).problems():  # type: ignore[arg-type]  # str and int fields by name
        raise fail(f"{problems[0]}: nothing was updated", EXIT_BAD_ARGUMENT)
    authority = signing_keypair(wallet)
    try:
        update = load_run_config(config_path, run_id, client_version) if config_path else None
    except ConfigError as error:
        raise fail(f"invalid config:\n{error}", EXIT_BAD_ARGUMENT) from None
    if (update is None and client_version is None and restart_from_step is None
            and not switch_to_hub and not metadata_given):
        raise fail("nothing to update: give --config-path, --client-version, "
                    "--restart-from-step, --switch-to-hub and/or the metadata (--name, "
                    "--description, --num-parameters, --vocab-size)", EXIT_BAD_ARGUMENT)
    for note in update.notes if update else []:
        typer.echo(f"run-manager: note: {note}", err=True)

    async def work(client: Any) -> None:
        run = await find_run(client, run_id, treasurer_index)
        signer = authority_of(run, authority)
        current = run.account.state
        config = update.config if update else current.config if current else None
        model = update.model if update else current.model if current else None
        if (restart_from_step is not None or switch_to_hub) and (config is None or model is None):
            raise fail(f"run {run_id!r} has no config and model yet: give --config-path",
                        EXIT_BAD_ARGUMENT)
        instructions = []
        if update is not None:
            instructions.append(ix.update_config(run.address, signer, update.config))
        if switch_to_hub:
            assert model is not None
            model = model.model_copy(update={"checkpoint": hub_of(model.checkpoint)})
        if update is not None or switch_to_hub:
            assert model is not None
            model_instructions = ix.update_model(run.address, signer, model)
            # Only the checkpoint changed: its head instruction carries it, and resending
            # the unchanged rest would repeat an earlier transaction byte for byte.
            instructions.extend(model_instructions if update else model_instructions[:1])
        if restart_from_step is not None:
            assert config is not None and model is not None and current is not None
            index = data_index_for_step(config, model.max_seq_len, restart_from_step)
            instructions.append(ix.update_progress(run.address, signer, current.progress.epoch,
                                                   restart_from_step, index))
        if client_version is not None:
            instructions.append(ix.update_client_version(run.address, signer, client_version))
        await admin(client, run, authority, instructions)
        if metadata_given:
            await set_metadata(client, run, authority, metadata_given)

    run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"updated run {run_id!r}")


async def set_metadata(client: Any, run: Any, authority: Any, given: dict[str, Any]) -> None:
    """The run's metadata with the `given` fields changed (Psyche's update-config keeps
    the others), set directly or, on a treasurer run, through the treasurer."""
    from dataclasses import replace

    from psyche_solana import run_metadata

    current = await run_metadata.read_metadata(client, run.address)
    metadata = replace(current or run_metadata.RunMetadata(), **given)
    me = authority.pubkey()
    instruction = run_metadata.set_run_metadata(run.address, me, me, metadata) \
        if run.treasurer_index is None else run_metadata.treasurer_run_set_metadata(
            me, run.treasurer_index, run.address, metadata)
    await client.send_instructions([instruction], authority)


def hub_of(checkpoint: Any) -> Any:
    """Psyche's --switch-to-hub: P2P and Dummy become Hub of the same repository and
    revision; any other checkpoint is left as it is."""
    from coordinator.config import DummyCheckpoint, HubCheckpoint, P2PCheckpoint

    if isinstance(checkpoint, P2PCheckpoint | DummyCheckpoint):
        return HubCheckpoint(repo_id=checkpoint.repo_id, revision=checkpoint.revision)
    return checkpoint


def authority_of(run: Any, authority: Any) -> Any:
    """The key the coordinator sees as signer: the treasurer's Run PDA for treasurer runs."""
    from psyche_solana import instructions as ix

    if run.treasurer_index is not None:
        return ix.treasurer_run_address(run.treasurer_index)
    return authority.pubkey()


def set_paused(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
               program_id: ProgramId = None,
               treasurer_index: TreasurerIndex = None,
               resume: Annotated[bool, typer.Option("--resume", help="Resume instead.")] = False) -> None:
    """Pause a run (after the current epoch if one is running), or resume it."""
    from psyche_solana import instructions as ix
    from psyche_solana.runs import admin, find_run

    authority = signing_keypair(wallet)

    async def work(client: Any) -> None:
        run = await find_run(client, run_id, treasurer_index)
        await admin(client, run, authority, [
            ix.set_paused(run.address, authority_of(run, authority), not resume)])

    run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"run {run_id!r} {'resumed' if resume else 'paused'}")


def set_future_epoch_rates(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL,
                           rpc_2: Rpc2 = None, program_id: ProgramId = None,
                           treasurer_index: TreasurerIndex = None,
                           earning_rate_total_shared: Annotated[str | None, typer.Option(
                               help="Shared by the epoch's clients: reward tokens (e.g. "
                                    "1.5) on a treasurer run, else whole points.")] = None,
                           slashing_rate_per_client: Annotated[str | None, typer.Option(
                               help="Taken from each ejected client, same unit.")] = None,
                           ) -> None:
    """Set the points shared per epoch (and slashing) from the next epoch on."""
    from psyche_solana import instructions as ix
    from psyche_solana.runs import admin, find_run, mint_decimals

    if earning_rate_total_shared is None and slashing_rate_per_client is None:
        raise fail("nothing to set: give --earning-rate-total-shared and/or "
                    "--slashing-rate-per-client", EXIT_BAD_ARGUMENT)
    authority = signing_keypair(wallet)

    async def work(client: Any) -> tuple[int | None, int | None]:
        run = await find_run(client, run_id, treasurer_index)
        # 1 point pays 1 base unit of the reward token: amounts are in token units, as
        # Psyche's, on a treasurer run; a run without one counts bare points
        decimals = (await mint_decimals(client, run.treasurer.collateral_mint)
                    if run.treasurer is not None else 0)
        earning, slashing = (
            None if text is None else parse_amount(text, decimals, flag)
            for text, flag in ((earning_rate_total_shared, "--earning-rate-total-shared"),
                               (slashing_rate_per_client, "--slashing-rate-per-client")))
        await admin(client, run, authority, [ix.set_future_epoch_rates(
            run.address, authority_of(run, authority), earning, slashing)])
        return earning, slashing

    earning, slashing = run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"future epoch rates of {run_id!r} set (points per epoch: earning {earning}, "
               f"slashing {slashing})")


def json_dump_run(run_id: RunId, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                  program_id: ProgramId = None,
                  treasurer_index: TreasurerIndex = None) -> None:
    """Print a run's on-chain state as JSON."""
    from psyche_solana.dump import run_json
    from psyche_solana.run_metadata import read_metadata
    from psyche_solana.runs import find_run

    async def work(client: Any) -> dict[str, Any]:
        run = await find_run(client, run_id, treasurer_index)
        return run_json(run, await read_metadata(client, run.address))

    typer.echo(json.dumps(run_rpc(rpc, rpc_2, program_id, work), indent=2))


def json_dump_user(run_id: RunId, address: Address,
                   rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
                   program_id: ProgramId = None, treasurer_index: TreasurerIndex = None) -> None:
    """Print one user's state in a run as JSON."""
    from psyche_solana import instructions as ix
    from psyche_solana.accounts import decode_participant
    from psyche_solana.dump import user_json
    from psyche_solana.runs import find_run

    user = parse_address(address)

    async def work(client: Any) -> dict[str, Any]:
        run = await find_run(client, run_id, treasurer_index)
        participant = None
        if run.treasurer_index is not None:
            data = await client.account_data(ix.participant_address(
                ix.treasurer_run_address(run.treasurer_index), user))
            participant = decode_participant(data) if data else None
        return user_json(run, user, await client.balance(user), participant)

    typer.echo(json.dumps(run_rpc(rpc, rpc_2, program_id, work), indent=2))


def tick(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
         program_id: ProgramId = None,
         ms_interval: Annotated[int, typer.Option()] = 1000,
         count: Annotated[int | None, typer.Option(help="Default: until Ctrl+C.")] = None) -> None:
    """Tick a run's coordinator periodically (anyone may)."""
    from psyche_solana import instructions as ix
    from psyche_solana.rpc import ProgramError
    from psyche_solana.runs import find_run

    payer = signing_keypair(wallet)

    async def work(client: Any) -> int:
        run = await find_run(client, run_id)
        sent, started = 0, time.monotonic()
        while count is None or sent < count:
            try:
                await client.send_instructions(ix.tick_with_budget(run.address), payer)
            except ProgramError as error:
                typer.echo(f"tick: {error}", err=True)
            sent += 1
            await asyncio.sleep(max(0.0, started + sent * ms_interval / 1000 - time.monotonic()))
        return sent

    typer.echo(f"sent {run_rpc(rpc, rpc_2, program_id, work)} ticks")
