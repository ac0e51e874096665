"""The model across epochs: load it at warm-up, checkpoint and share it at cooldown.

    load(state, sources)   the run's current model. A P2P checkpoint means the clients of the
                           last epoch hold it: from this client's own checkpoint of that
                           cooldown if it wrote one (a holder that restarted: it reloads and
                           serves it), else from `sources` (peers that may have gone through
                           the last cooldown), at exactly the epoch's start step, or not at
                           all (never the stale Hub model).
                           P2PGcs is loaded the same way. Otherwise from the Hub (or the
                           local directory) it names, or a Gcs checkpoint downloaded from
                           its bucket and prefix (training/gcs_checkpoint.py).
    save_and_share(state)  round the weights to bf16 (as Psyche does), write the checkpoint
                           (when a directory is set), upload it in the background (when a
                           Hub repo or a GCS bucket is set) and report it to the coordinator
                           (Hub or Gcs), then serve the weights to the next joiners
    hub_repo_problem(...)  why the coordinator would refuse this client's reports: only
                           the run's own repository (its authority's) may get new revisions

A Dummy checkpoint is built, not loaded: its config (repo_id's config.json, or a small
built-in Llama) with seeded weights, the same on every client (training/dummy_model.py).
It holds no round state; the round runner decides when to call it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from client_image.runtime.events import (
    Checkpointed,
    CheckpointFailed,
    CheckpointNotReported,
    ModelLoaded,
    Uploaded,
    UploadFailed,
)
from client_image.runtime.observability import EventLog
from client_image.runtime.ports import CoordinatorLink, ModelUnavailable, Peers, Worker
from client_image.runtime.tasks import Spawn
from client_image.training.checkpoint import CheckpointError, checkpoint_name, read_checkpoint
from coordinator import CoordinatorError, CoordinatorState, NodeIdentity
from coordinator.checkpoint_reports import Report, location_problem, report_problem
from coordinator.config import (
    Checkpoint,
    DummyCheckpoint,
    GcsCheckpoint,
    HubCheckpoint,
    P2PCheckpoint,
    P2PGcsCheckpoint,
)
from coordinator.messages import CheckpointReport

REFUSED = CoordinatorError.CheckpointNotRunRepository


def hub_repo_problem(hub_repo: str | None, checkpoint: Checkpoint) -> str | None:
    """Why the coordinator would refuse reports of uploads to `hub_repo` on a run whose
    checkpoint is `checkpoint` (None: it would accept them, or nothing is uploaded)."""
    if not hub_repo:
        return None
    return location_problem(checkpoint, HubCheckpoint(repo_id=hub_repo))


@dataclass(frozen=True)
class CheckpointOptions:
    checkpoint_dir: Path | None = None
    keep_steps: int = 3
    delete_old_steps: bool = True
    hub_repo: str | None = None  # upload each epoch's checkpoint here, then report it
    hub_token: str | None = None
    gcs_bucket: str | None = None  # or to this bucket (and prefix), then report Gcs
    gcs_prefix: str | None = None
    gcs_cache_dir: Path | None = None  # where Gcs checkpoints are downloaded (None: default)


class ModelKeeper:
    def __init__(self, me: NodeIdentity, worker: Worker, peers: Peers, backend: CoordinatorLink,
                 events: EventLog, options: CheckpointOptions, spawn: Spawn):
        self.me = me
        self.worker = worker
        self.peers = peers
        self.backend = backend
        self.events = events
        self.options = options
        self.spawn = spawn

    async def load(self, state: CoordinatorState, sources: Sequence[bytes]) -> None:
        llm, checkpoint = state.model, state.model.checkpoint
        start_step = state.epoch_state.start_step
        started = time.monotonic()
        if isinstance(checkpoint, P2PCheckpoint | P2PGcsCheckpoint):
            # A holder that restarted: its own checkpoint of the last cooldown is the model,
            # bit for bit (the bf16 weights it shared). Loaded first, not after the peers
            # failed: asking them first cost a restarted holder the whole manifest timeout,
            # the joiners waiting for it gave up meanwhile, and the run lost its model.
            local = self.own_checkpoint(state)
            if local is not None:
                await self._load_own(state, local, started)
                return
            if not sources:
                raise ModelUnavailable(
                    f"the run's model of step {start_step} is held by the last epoch's "
                    "clients and none of them is in this epoch: sitting this epoch out")
            fetched = await self.peers.fetch_model(sources, start_step)
            await self.worker.load_from_peers(fetched.config_json, fetched.tokenizer_json,
                                              fetched.state_dict, llm, start_step)
            self.events.emit(ModelLoaded(source="p2p", peers=fetched.peers, bytes=fetched.bytes,
                                         seconds=round(time.monotonic() - started, 2)))
            return
        if isinstance(checkpoint, DummyCheckpoint):
            await self.worker.load_dummy(checkpoint.repo_id, llm, start_step)
            self.events.emit(ModelLoaded(source="dummy", repo=checkpoint.repo_id,
                                         seconds=round(time.monotonic() - started, 2)))
            return
        if isinstance(checkpoint, HubCheckpoint):
            await self.worker.load_from_hub(checkpoint.repo_id, checkpoint.revision, llm,
                                            start_step)
            self.events.emit(ModelLoaded(source="hub", repo=checkpoint.repo_id,
                                         seconds=round(time.monotonic() - started, 2)))
            return
        if isinstance(checkpoint, GcsCheckpoint):
            from client_image.training.gcs_checkpoint import (
                download_checkpoint_from_gcs,
                gcs_location,
            )

            directory = await asyncio.to_thread(download_checkpoint_from_gcs, checkpoint.bucket,
                                                checkpoint.prefix, self.options.gcs_cache_dir)
            await self.worker.load_from_hub(str(directory), None, llm, start_step)
            self.events.emit(ModelLoaded(source="gcs",
                                         repo=gcs_location(checkpoint.bucket, checkpoint.prefix),
                                         detail=directory.name,  # step{N} of its manifest
                                         seconds=round(time.monotonic() - started, 2)))
            return
        raise RuntimeError(f"checkpoint {type(checkpoint).__name__} cannot be loaded by this client")

    async def save_and_share(self, state: CoordinatorState) -> None:
        step = state.progress.step - 1
        options = self.options
        # Every client rounds, with or without a checkpoint directory: the model it keeps
        # must be the bf16 one it checkpoints and shares, bit for bit, or the clients that
        # load it from peers or from the Hub next epoch would diverge from those that kept it.
        await self.worker.round_to_bf16()
        if options.checkpoint_dir is not None:
            keep = options.keep_steps if options.delete_old_steps else 1_000_000
            try:
                path = await self.worker.save_checkpoint(options.checkpoint_dir, state.run_id,
                                                         step, keep)
            except CheckpointError as exc:
                # Only the local copy is lost: the next epoch's joiners still get the model
                # from memory (below), or the run would fall back to the stored checkpoint.
                self.events.emit(CheckpointFailed(step=step, epoch=state.progress.epoch,
                                                  directory=str(options.checkpoint_dir),
                                                  error=str(exc)[:300]))
            else:
                self.events.emit(Checkpointed(step=step, epoch=state.progress.epoch,
                                              path=str(path)))
                if options.hub_repo:
                    self.spawn(self._upload(state, path, step, options.hub_repo),
                               f"upload-{step}")
                elif options.gcs_bucket:
                    self.spawn(self._upload_gcs(state, path, step, options.gcs_bucket,
                                                options.gcs_prefix), f"upload-{step}")
        # The next epoch starts at this step: joiners ask for exactly this model.
        await self._serve(state.progress.step)

    async def _load_own(self, state: CoordinatorState, local: Path, started: float) -> None:
        """Load this client's checkpoint `local` of the model of the epoch's start step and
        serve it; while it loads, fetchers are told so (and how big it is), so they wait
        for it instead of giving up after the manifest timeout."""
        start_step = state.epoch_state.start_step
        size = sum(file.stat().st_size for file in local.glob("*.safetensors"))
        self.peers.announce_loading(start_step, size)
        config_json, tokenizer_json, weights = await asyncio.to_thread(read_checkpoint, local)
        await self.worker.load_from_peers(config_json, tokenizer_json, weights, state.model,
                                          start_step)
        await self._serve(start_step)
        self.events.emit(ModelLoaded(source="local", repo=str(local), bytes=size,
                                     seconds=round(time.monotonic() - started, 2)))

    async def _serve(self, start_step: int) -> None:
        weights, config_json, tokenizer_json = await self.worker.sharing_payload()
        self.peers.share_model(weights, config_json, tokenizer_json, start_step)

    def own_checkpoint(self, state: CoordinatorState) -> Path | None:
        """This client's checkpoint of the cooldown before this epoch (the model of its
        start step), if it wrote one and it is complete (written under a staging name,
        then renamed: a crash never leaves a partial one under the final name)."""
        directory = self.options.checkpoint_dir
        if directory is None or state.epoch_state.start_step < 1:
            return None
        path = directory / checkpoint_name(state.run_id, state.epoch_state.start_step - 1)
        return path if (path / "config.json").is_file() else None

    async def _upload(self, state: CoordinatorState, path: Path, step: int, repo: str) -> None:
        """Upload the checkpoint to the hub in the background, then tell the coordinator where
        it is (Psyche's Checkpoint::Hub), so the next epoch can start from it if no peer can."""
        from client_image.training import upload_checkpoint

        try:
            revision = await asyncio.to_thread(upload_checkpoint, path, repo, step,
                                               token=self.options.hub_token)
        except Exception as exc:  # no hub, no token, no write access: the run goes on
            self.events.emit(UploadFailed(step=step, repo=repo, error=str(exc)[:300]))
            return
        self.events.emit(Uploaded(step=step, repo=repo, revision=revision))
        await self._report(state, step, repo, HubCheckpoint(repo_id=repo, revision=revision))

    async def _upload_gcs(self, state: CoordinatorState, path: Path, step: int, bucket: str,
                          prefix: str | None) -> None:
        """Upload the checkpoint and Psyche's manifest.json to the bucket in the background,
        then report Gcs{bucket, prefix} (the event's revision: the manifest's generation)."""
        from client_image.training.gcs_checkpoint import gcs_location, upload_checkpoint_to_gcs

        where = gcs_location(bucket, prefix)
        try:
            upload = await asyncio.to_thread(upload_checkpoint_to_gcs, path, bucket, prefix,
                                             run_id=state.run_id, epoch=state.progress.epoch,
                                             step=step)
        except Exception as exc:  # no bucket, no credentials, no write access: go on
            self.events.emit(UploadFailed(step=step, repo=where, error=str(exc)[:300]))
            return
        self.events.emit(Uploaded(step=step, repo=where,
                                  revision=str(upload.manifest_generation)))
        await self._report(state, step, where, GcsCheckpoint(bucket=bucket, prefix=prefix))

    async def _report(self, state: CoordinatorState, step: int, repo: str,
                      report: Report) -> None:
        index = state.index_of(self.me)
        if index is None:
            return
        # Only the run's authority sets its repository: a report naming another would be
        # refused (on Solana, a failed transaction that still costs its fee), so say so
        # once per upload and keep going. A refusal despite this check (the authority
        # moved the repository meanwhile) arrives as one `coordinator_error` event.
        problem = report_problem(state.model.checkpoint, report)
        if problem is not None:
            self.events.emit(CheckpointNotReported(step=step, repo=repo, error=REFUSED.name,
                                                   detail=problem))
            return
        await self.backend.report_checkpoint(CheckpointReport(index=index, repo=report))
