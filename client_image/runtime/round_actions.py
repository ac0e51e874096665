"""The client's actions per coordinator phase (see client.py for the sequence).

Functions, not methods, so each phase reads top-down; they share the PsycheClient's
state and run as tasks that the client guards (an exception is a desync, never a crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

from client_image.p2p import ModelFetchOptions, step_tag
from client_image.runtime.rounds import (
    BatchKey,
    StepRecord,
    commitment_of,
    consensus_winners,
    make_witness,
    my_witness_proof,
    unhealthy_trainers,
)
from client_image.telemetry import traced_phase
from coordinator import ClientState, CoordinatorState, RunState
from coordinator.config import (
    HttpDataLocation,
    HubCheckpoint,
    LocalDataLocation,
    P2PCheckpoint,
    ServerDataLocation,
)
from coordinator_tcp.protocol import (
    CheckpointReport,
    HealthCheck,
    HealthCheckEntry,
    WarmupWitness,
    WitnessMetadata,
    WitnessModel,
    WitnessSubmit,
)

if TYPE_CHECKING:
    from client_image.data import DataProvider
    from client_image.runtime.client import PsycheClient


# ------------------------------------------------------------------ warmup
@traced_phase("warmup")
async def warmup(client: PsycheClient, state: CoordinatorState) -> None:
    if not (client.worker.loaded and client.model_fresh and not client.desynced):
        await _load_model(client, state)
    if client.data_provider is None:
        client.data_provider = await _open_data(client, state)
    client.desynced = False
    client.model_fresh = True
    client.records.clear()
    client.warmup_finished.add(client.me.key)
    client.events.emit("ready", epoch=state.progress.epoch)
    await client.broadcast_finished(state.progress.step, warmup=True)
    await maybe_warmup_witness(client)


async def _load_model(client: PsycheClient, state: CoordinatorState) -> None:
    llm, checkpoint = state.model, state.model.checkpoint
    start_step = state.epoch_state.start_step
    listed = {c.id.key for c in state.epoch_state.clients}
    # Only peers that went through the last Cooldown hold the current model (#30).
    sources = [key for key in client.previous_epoch_clients
               if key != client.me.key and key in listed]
    started = time.monotonic()
    if isinstance(checkpoint, P2PCheckpoint) and sources:
        manifest, state_dict, report = await client.node.model_sharing.fetch_model(
            sources, ModelFetchOptions(
                max_concurrent_parameter_requests=client.options.max_concurrent_parameter_requests),
            progress=client.telemetry.model_progress if client.telemetry else None)
        await client.worker.load_from_peers(manifest.config_json, manifest.tokenizer_json,
                                            state_dict, llm, start_step)
        client.events.emit("model_loaded", source="p2p", peers=len(report.served_by),
                           bytes=report.total_bytes, seconds=round(time.monotonic() - started, 2))
        return
    if isinstance(checkpoint, HubCheckpoint | P2PCheckpoint):
        await client.worker.load_from_hub(checkpoint.repo_id, checkpoint.revision, llm, start_step)
        client.events.emit("model_loaded", source="hub", repo=checkpoint.repo_id,
                           seconds=round(time.monotonic() - started, 2))
        return
    raise RuntimeError(f"checkpoint {type(checkpoint).__name__} cannot be loaded by this client")


async def _open_data(client: PsycheClient, state: CoordinatorState) -> DataProvider:
    from client_image.data import TcpDataProvider, open_provider

    location = state.model.data_location
    if isinstance(location, LocalDataLocation | HttpDataLocation):
        return await open_provider(location, state.model.max_seq_len)
    if isinstance(location, ServerDataLocation):
        return await TcpDataProvider.open(location.address, client.options.identity,
                                          state.run_id, state.model.max_seq_len)
    raise RuntimeError(f"data location {type(location).__name__} is not supported")


async def maybe_warmup_witness(client: PsycheClient) -> None:
    """Once every listed client has loaded, the first W clients report warm-up done."""
    state = client.state
    if state is None or state.run_state is not RunState.Warmup or not client.model_fresh:
        return
    index = state.index_of(client.me)
    if index is None or index >= state.config.witness_count(len(state.epoch_state.clients)):
        return
    everyone = {c.id.key for c in state.epoch_state.clients if c.state is ClientState.Healthy}
    if not everyone <= client.warmup_finished or client.warmup_epoch is None:
        return
    if client.warmup_witness_epoch == client.warmup_epoch:
        return
    client.warmup_witness_epoch = client.warmup_epoch
    witness = make_witness(None, index, index, False)
    assert client.backend is not None
    await client.backend.send(WarmupWitness(witness=WitnessModel.of(witness)))
    client.counters.witnesses_sent += 1
    client.events.emit("warmup_witness", epoch=state.progress.epoch)


# ------------------------------------------------------------------ training round
async def train_round(client: PsycheClient, state: CoordinatorState, record: StepRecord) -> None:
    step, height = record.step, record.height
    proof = my_witness_proof(state, client.me)
    if proof is not None and proof[2] and height >= 2 and step - 2 in client.records:
        await _health_check(client, state, client.records[step - 2])
    if height >= 2:
        await _apply(client, state, step)
    last_step = state.epoch_state.last_step
    batch = record.batch_of(client.me.key)
    if batch is not None and (last_step == 0 or step < last_step - 2):
        await _train(client, state, record, batch)
    record.trained = True
    await maybe_finish(client, step)


async def _health_check(client: PsycheClient, state: CoordinatorState,
                        judged: StepRecord) -> None:
    expected = {node.key for node in judged.assignments.values()}
    checks = unhealthy_trainers(state, expected)
    if not checks:
        return
    assert client.backend is not None
    entries = [HealthCheckEntry.model_validate(
        {"node": node.key, "committee": proof.committee.name, "position": proof.position,
         "index": proof.index}) for node, proof in checks]
    await client.backend.send(HealthCheck(checks=entries))
    client.events.emit("health_check", step=state.progress.step,
                       unhealthy=[node.key.hex()[:12] for node, _ in checks])


@traced_phase("apply")
async def _apply(client: PsycheClient, state: CoordinatorState, step: int) -> None:
    record = client.records.get(step - 2)
    vouching = state.previous_round
    if record is None or vouching is None:
        client.set_desynced(f"no record of step {step - 2} to apply")
        return
    winners = consensus_winners(record, vouching)
    deadline = time.monotonic() + client.options.apply_download_timeout_s
    while any(c not in record.payloads for c in winners.values()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # downloads in flight finish; failures leave them missing
    missing = [batch for batch, c in winners.items() if c not in record.payloads]
    if missing:
        client.set_desynced(f"step {step - 2}: consensus results {missing} not downloadable")
        raise RuntimeError(f"missing consensus payloads for step {step - 2}")
    payloads = [record.payloads[winners[batch]] for batch in sorted(winners)]
    applied = await client.worker.apply(step, payloads)
    skipped = len(record.assignments) - len(winners)
    client.counters.apply_message_success += applied
    client.counters.last_result_sizes = [len(p) for p in payloads]
    client.events.emit("applied", step=step, of_step=step - 2, results=applied, skipped=skipped)


@traced_phase("train")
async def _train(client: PsycheClient, state: CoordinatorState, record: StepRecord,
                 batch: BatchKey) -> None:
    step = record.step
    provider = client.data_provider
    assert provider is not None
    tokens = await provider.fetch(batch[0], batch[1])
    cold_start = record.height == 0 and state.epoch_state.cold_start_epoch
    started = time.monotonic()
    out = await client.worker.train(step, tokens, batch, cold_start)
    elapsed = time.monotonic() - started
    payload = out.payload or b""
    commitment = commitment_of(step, batch, payload)
    blob_hash = client.node.blob_store.add(payload, tag=step_tag("result", step))
    if client.options.write_gradients_dir is not None:
        directory = client.options.write_gradients_dir
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"result-{client.me.key.hex()[:16]}-step{step}-batch{batch[0]}.bin"
         ).write_bytes(payload)
    record.announce(batch, commitment, client.me.key, blob_hash, len(payload))
    record.record_verified(batch, commitment, payload)
    await client.announce(step, batch, commitment, blob_hash, len(payload))
    client.counters.loss = out.loss
    client.counters.tokens_per_sec = tokens.numel() / max(elapsed, 1e-9)
    client.events.emit("trained", step=step, epoch=state.progress.epoch, loss=round(out.loss, 5),
                       batch=list(batch), payload_bytes=len(payload),
                       seconds=round(elapsed, 3), tokens=tokens.numel())


async def download_result(client: PsycheClient, record: StepRecord, batch: BatchKey,
                          commitment: bytes) -> None:
    announced = record.announced[batch][commitment]
    try:
        data = await client.node.blobs.download(announced.blob_hash, announced.blob_size,
                                                [announced.sender])
    except Exception as exc:
        client.counters.apply_message_failure += 1
        client.events.emit("download_failed", step=record.step, batch=list(batch),
                           error=str(exc)[:200])
        return
    if commitment_of(record.step, batch, data) != commitment:
        client.counters.apply_message_failure += 1
        client.events.emit("bad_result", step=record.step, batch=list(batch),
                           reason="payload does not match its commitment")
        return
    try:
        await client.worker.decode(data)
    except Exception as exc:  # ResultDecodeError: a peer's garbage never reaches the weights
        client.counters.apply_message_failure += 1
        client.events.emit("bad_result", step=record.step, batch=list(batch), reason=str(exc))
        return
    record.record_verified(batch, commitment, data)
    client.counters.downloaded_current += 1
    client.counters.result_bytes_received += len(data)
    await maybe_finish(client, record.step + 1)


# ------------------------------------------------------------------ witnessing
async def maybe_finish(client: PsycheClient, step: int) -> None:
    """Gossip Finished{step} once our step is trained and all of step-1 is downloaded."""
    record = client.records.get(step)
    if record is None or not record.trained or record.finished_sent:
        return
    previous = client.records.get(step - 1)
    if record.height > 0 and previous is not None and not previous.all_downloaded():
        return
    record.finished_sent = True
    record.finished_from.add(client.me.key)
    await client.broadcast_finished(step)
    await maybe_witness(client, step)


async def maybe_witness(client: PsycheClient, step: int) -> None:
    """Opportunistic witnessing: submit as soon as every client has finished the step."""
    state, record = client.state, client.records.get(step)
    if state is None or record is None or state.progress.step != step:
        return
    everyone = {c.id.key for c in state.epoch_state.clients if c.state is ClientState.Healthy}
    if everyone <= record.finished_from:
        await _submit_witness(client, state, record)


async def witness_now(client: PsycheClient, state: CoordinatorState) -> None:
    record = client.records.get(state.progress.step)
    if record is not None:
        if client.round_task is not None and not client.round_task.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(client.round_task), 5)
        await _submit_witness(client, state, record)


async def _submit_witness(client: PsycheClient, state: CoordinatorState,
                          record: StepRecord) -> None:
    proof = my_witness_proof(state, client.me)
    if proof is None or not proof[2] or record.witness_sent:
        return
    record.witness_sent = True
    await _send_witness(client, record, proof)


@traced_phase("witness")
async def _send_witness(client: PsycheClient, record: StepRecord,
                        proof: tuple[int, int, bool]) -> None:
    index, position, _ = proof
    previous = client.records.get(record.step - 1)
    vouched = previous if record.height > 0 and previous is not None else None
    witness = make_witness(vouched, index, position, True)
    assert client.backend is not None
    await client.backend.send(WitnessSubmit(
        witness=WitnessModel.of(witness),
        metadata=WitnessMetadata(step=record.step, loss=client.counters.loss,
                                 tokens_per_sec=client.counters.tokens_per_sec)))
    client.counters.witnesses_sent += 1
    client.events.emit("witness", step=record.step,
                       vouched=len(vouched.accepted_order) if vouched else 0)


# ------------------------------------------------------------------ cooldown
@traced_phase("cooldown")
async def cooldown(client: PsycheClient, state: CoordinatorState) -> None:
    if client.round_task is not None:
        with contextlib.suppress(Exception):
            await client.round_task
    if not client.worker.loaded or client.desynced:
        return
    step = state.progress.step - 1
    if client.options.checkpoint_dir is not None:
        keep = client.options.keep_steps if client.options.delete_old_steps else 1_000_000
        path = await client.worker.save_checkpoint(client.options.checkpoint_dir, state.run_id,
                                                   step, keep)
        client.events.emit("checkpoint", step=step, epoch=state.progress.epoch, path=str(path))
        if client.options.hub_repo:
            client.spawn(_upload(client, state, path, step), f"upload-{step}")
    weights, config_json, tokenizer_json = await asyncio.to_thread(client.worker.sharing_payload)
    client.node.model_sharing.share(weights, config_json, tokenizer_json)


async def _upload(client: PsycheClient, state: CoordinatorState, path: Path, step: int) -> None:
    """Upload the checkpoint to the hub in the background, then tell the coordinator where
    it is (Psyche's Checkpoint::Hub), so the next epoch can start from it if no peer can."""
    from client_image.training import upload_checkpoint

    repo = client.options.hub_repo
    assert repo is not None
    try:
        revision = await asyncio.to_thread(upload_checkpoint, path, repo, step,
                                           token=client.options.hub_token)
    except Exception as exc:  # no hub, no token, no write access: the run goes on
        client.events.emit("upload_failed", step=step, repo=repo, error=str(exc)[:300])
        return
    index = state.index_of(client.me)
    client.events.emit("uploaded", step=step, repo=repo, revision=revision)
    if index is not None and client.backend is not None:
        await client.backend.send(CheckpointReport(
            index=index, hub=HubCheckpoint(repo_id=repo, revision=revision)))
