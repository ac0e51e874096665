"""The Solana subcommands at the two ends of a run's life beyond create/pause: close a
halted run (Psyche's close-run, the coordinator's free_coordinator) and set the
checkpoint a paused run restarts from (Psyche's checkpoint, as its authority), and accept
that a run's newer model is lost (ours: the run otherwise waits for a client that holds it)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from run_manager.commands.solana_common import (
    EXIT_BAD_ARGUMENT,
    LOCALNET_URL,
    ProgramId,
    Rpc,
    Rpc2,
    RunId,
    TreasurerIndex,
    Wallet,
    fail,
    run_rpc,
    signing_keypair,
)


def close_run(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
              program_id: ProgramId = None,
              treasurer_index: TreasurerIndex = None,
              force: Annotated[bool, typer.Option(
                  "--force", help="Close a treasurer run even though points earned in it "
                                  "are not claimed yet (they never can be then).")] = False,
              ) -> None:
    """Close a paused, finished or never started run; its rent goes back to the wallet."""
    from psyche_solana import instructions as ix
    from psyche_solana.run_metadata import treasurer_run_close
    from psyche_solana.runs import find_run

    authority = signing_keypair(wallet)

    async def work(client: Any) -> tuple[int, int]:
        run = await find_run(client, run_id, treasurer_index)
        if run.account.run_state.name not in ("Uninitialized", "Paused", "Finished"):
            raise fail(f"run {run_id!r} is {run.account.run_state.name}: pause it first "
                        "(set-paused) and wait for Paused")
        me = authority.pubkey()
        unclaimed = 0
        if run.treasurer_index is not None and run.treasurer is not None:
            # its authority is the treasurer's Run PDA: the treasurer closes it for the
            # Run's main authority
            earned = sum(run.account.earned(key) for key, _active in run.account.registry)
            unclaimed = earned - run.treasurer.total_claimed_earned_points
            if unclaimed > 0 and not force:
                # Closing forgets who earned what: the participants' rewards would be lost.
                raise fail(f"run {run_id!r}: {unclaimed} earned points are not claimed yet "
                            "and could not be once it is closed; let the participants claim "
                            "(treasurer-claim-rewards), or close it anyway with --force")
            close = treasurer_run_close(me, run.treasurer_index, run.address, run_id)
        else:
            close = ix.free_coordinator(run.address, me, run_id, me)
        before = await client.balance(me)
        await client.send_instructions([close], authority)
        return await client.balance(me) - before, unclaimed

    refund, unclaimed = run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"closed run {run_id!r}: {refund / 1e9:.9f} SOL of rent (less the fee) back "
               "to the wallet; the run id is free again")
    if unclaimed > 0:
        typer.echo(f"run-manager: note (--force): {unclaimed} earned points were not claimed "
                   "and no longer can be; the reward vault keeps its tokens", err=True)


def checkpoint(run_id: RunId,
               repo: Annotated[str, typer.Option(help="Hugging Face repository of the model.")],
               revision: Annotated[str | None, typer.Option(
                   help="Its revision (commit, branch or tag).")] = None,
               wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None,
               program_id: ProgramId = None,
               treasurer_index: TreasurerIndex = None) -> None:
    """As the authority, set the Hub checkpoint a paused run restarts from."""
    from coordinator.config import HubCheckpoint
    from psyche_solana import instructions as ix
    from psyche_solana.runs import admin, find_run
    from run_manager.commands.solana_runs import authority_of

    if not repo or len(repo.encode()) > 64 or (revision is not None and
                                                 not 0 < len(revision.encode()) <= 64):
        raise fail("--repo and --revision are 1 to 64 bytes each", EXIT_BAD_ARGUMENT)
    authority = signing_keypair(wallet)

    async def work(client: Any) -> None:
        run = await find_run(client, run_id, treasurer_index)
        state = run.account.state
        if run.account.run_state.name not in ("Uninitialized", "Paused"):
            # the coordinator accepts a client's report only from a client of the epoch,
            # and only a new revision of the run's own repository (the client sends it)
            raise fail(f"run {run_id!r} is {run.account.run_state.name}: its authority sets "
                        "the checkpoint of a paused run (set-paused first); during an epoch "
                        "the run's clients report theirs")
        if state is None:
            raise fail(f"run {run_id!r} has no model yet: update-config --config-path first",
                        EXIT_BAD_ARGUMENT)
        model = state.model.model_copy(update={
            "checkpoint": HubCheckpoint(repo_id=repo, revision=revision)})
        # the model head carries the checkpoint; the rest of the model is unchanged
        await admin(client, run, authority,
                    ix.update_model(run.address, authority_of(run, authority), model)[:1])

    run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"run {run_id!r} restarts from Hub {repo}" + (f" @ {revision}" if revision else ""))


def accept_model_loss(run_id: RunId, wallet: Wallet = None, rpc: Rpc = LOCALNET_URL,
                      rpc_2: Rpc2 = None, program_id: ProgramId = None,
                      treasurer_index: TreasurerIndex = None) -> None:
    """As the authority, let a run whose newer model is lost go on from its checkpoint.

    A run whose clients' newer model is gone (MODEL LOST) waits for a client that holds
    it; this gives up the training since the stored checkpoint instead, counted as a model
    reset."""
    from psyche_solana import instructions as ix
    from psyche_solana.runs import admin, find_run
    from run_manager.commands.solana_runs import authority_of

    authority = signing_keypair(wallet)

    async def work(client: Any) -> int:
        run = await find_run(client, run_id, treasurer_index)
        state = run.account.state
        if state is None or not (state.model_lost or state.model_ahead):
            raise fail(f"run {run_id!r}: its stored checkpoint is as new as its clients' "
                        "model, nothing to accept")
        if run.account.run_state.name not in ("WaitingForMembers", "Paused"):
            raise fail(f"run {run_id!r} is {run.account.run_state.name}: a loss is accepted "
                        "while the run waits for members or is paused")
        await admin(client, run, authority,
                    [ix.accept_model_loss(run.address, authority_of(run, authority))])
        after = (await find_run(client, run_id, treasurer_index)).account.state
        return after.model_resets if after is not None else 0

    resets = run_rpc(rpc, rpc_2, program_id, work)
    typer.echo(f"run {run_id!r} goes on from its stored checkpoint (model resets: {resets})")
