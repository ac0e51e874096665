"""Gcs and P2PGcs runs, against a real GCS-API server (gcp-storage-emulator on 127.0.0.1,
tests/gcs_emulator.py) and a real coordinator (runner_swarm.py): the first warm-up loads
the model the bucket holds, each client started with a GCS bucket uploads its checkpoint
and Psyche's manifest.json at cooldown and reports Gcs{bucket, prefix}, which the
coordinator accepts for the run's own location only."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gcs_emulator import gcs_emulator
from google.cloud import storage
from runner_swarm import FakeSwarm

from client_image.runtime.events import (
    Checkpointed,
    CheckpointNotReported,
    ModelLoaded,
    Uploaded,
    UploadFailed,
)
from client_image.runtime.model_keeper import CheckpointOptions
from client_image.training.gcs_checkpoint import upload_checkpoint_to_gcs
from coordinator import ClientState, RunState
from coordinator.config import GcsCheckpoint, P2PGcsCheckpoint
from coordinator.messages import CheckpointReport

FAST = {"epoch_time": 12, "warmup_time": 5, "max_round_train_time": 5}
TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "tiny-llama"
GCS_RUN = {"checkpoint": {"Gcs": {"bucket": "ckpts", "prefix": "run"}}}


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[storage.Client]:
    with gcs_emulator(monkeypatch) as client:
        client.create_bucket("ckpts")
        upload_checkpoint_to_gcs(TINY_MODEL, "ckpts", "run", run_id="init", epoch=0, step=0)
        yield client


def swarm_uploading_to(tmp_path: Path, bucket: str, prefix: str | None) -> FakeSwarm:
    options = CheckpointOptions(checkpoint_dir=tmp_path / "ckpt", gcs_bucket=bucket,
                                gcs_prefix=prefix, gcs_cache_dir=tmp_path / "cache")
    return FakeSwarm(3, model=GCS_RUN, checkpoints=options, **FAST)


def reports(swarm: FakeSwarm) -> list[tuple[Any, object]]:
    return [(m, result) for _, m, result in swarm.sent if isinstance(m, CheckpointReport)]


async def warmed_up_with_the_model(swarm: FakeSwarm, timeout_s: float = 60.0) -> None:
    """Into Warmup, then wait (real time, the coordinator's clock stopped) until every client
    has loaded the model from the emulator: the download runs in a thread, and on a loaded
    machine it can outlast a warm-up of simulated seconds, and the client sits the epoch
    out (the cause of this file's flaky failures)."""
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Warmup)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not all(swarm.worker(who).loads for who in swarm.nodes):
        assert asyncio.get_running_loop().time() < deadline, "the model was never loaded"
        await swarm.settle()
        await asyncio.sleep(0.05)


async def uploads_done(swarm: FakeSwarm) -> int:
    """Wait (real time, the coordinator's clock stopped) for the uploads of the clients that
    checkpointed (those of the epoch: a client whose load was slow may sit it out)."""
    await swarm.settle()
    writers = len(swarm.events_of(Checkpointed))
    for _ in range(300):
        if len(swarm.events_of(Uploaded)) + len(swarm.events_of(UploadFailed)) >= writers:
            break
        await swarm.settle()
        await asyncio.sleep(0.05)
    assert writers and len(swarm.events_of(Uploaded)) == writers, swarm.events_of(UploadFailed)
    return writers


async def test_a_gcs_run_loads_uploads_and_reports_its_bucket(
        gcs: storage.Client, tmp_path: Path) -> None:
    swarm = swarm_uploading_to(tmp_path, "ckpts", "run")
    await warmed_up_with_the_model(swarm)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown)
    downloaded = tmp_path / "cache" / "ckpts" / "run" / "step0"
    for who in swarm.nodes:
        assert swarm.worker(who).loads == [f"hub:{downloaded}"]
        [loaded] = swarm.events_of(ModelLoaded, who)
        assert (loaded.source, loaded.repo) == ("gcs", "gs://ckpts/run")
    assert sorted(p.name for p in downloaded.iterdir()) == sorted(
        [p.name for p in TINY_MODEL.iterdir()] + ["manifest.json"])
    writers = await uploads_done(swarm)
    manifest = json.loads(gcs.bucket("ckpts").blob("run/manifest.json").download_as_bytes())
    step = manifest["metadata"]["step"]
    assert [event.step for event in swarm.events_of(Uploaded)] == [step] * writers
    assert manifest["metadata"]["run_id"] == swarm.coordinator.state.run_id
    await swarm.drain(timeout_s=30)
    await swarm.run_until(lambda s: len(reports(s)) == writers, max_turns=50)
    assert [(m.repo, result) for m, result in reports(swarm)] == [
        (GcsCheckpoint(bucket="ckpts", prefix="run"), None)] * writers
    assert sorted(entry["filename"] for entry in manifest["files"]) == [
        "config.json", "model.safetensors"]  # what the fake worker's checkpoint holds
    assert not swarm.events_of(CheckpointNotReported)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.WaitingForMembers)
    assert swarm.coordinator.state.model.checkpoint == P2PGcsCheckpoint(bucket="ckpts",
                                                                        prefix="run")
    # The epoch's clients are dropped (as the health checks drop clients gone silent) and
    # join again: a dropped client is no holder of the model (a withdrawn one still is,
    # issue 32), so nobody holds it at the next warm-up; the upload's report said the
    # bucket has the clients' model, so the coordinator turns the checkpoint back into Gcs
    # without waiting, and the clients load what they uploaded.
    for client in swarm.coordinator.state.epoch_state.clients:
        client.state = ClientState.Dropped
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.run_state is RunState.RoundTrain)
    assert swarm.coordinator.state.model.checkpoint == GcsCheckpoint(bucket="ckpts", prefix="run")
    uploaded = tmp_path / "cache" / "ckpts" / "run" / f"step{step}"
    assert swarm.worker(swarm.nodes[0]).loads == [f"hub:{downloaded}", f"hub:{uploaded}"]


async def test_an_upload_to_another_bucket_is_kept_but_not_reported(
        gcs: storage.Client, tmp_path: Path) -> None:
    gcs.create_bucket("mine")
    swarm = swarm_uploading_to(tmp_path, "mine", None)
    await warmed_up_with_the_model(swarm)
    await swarm.run_until(lambda s: s.coordinator.state.run_state is RunState.Cooldown)
    writers = await uploads_done(swarm)
    for _ in range(20):
        await swarm.turn()
    assert gcs.bucket("mine").blob("manifest.json").exists()
    assert not reports(swarm)
    assert len(swarm.events_of(CheckpointNotReported)) == writers
    for _, warning in swarm.events:
        if not isinstance(warning, CheckpointNotReported):
            continue
        assert warning.error == "CheckpointNotRunRepository"
        assert "GCS bucket 'mine'" in warning.detail and "GCS bucket 'ckpts'" in warning.detail
