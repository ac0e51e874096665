"""Gcs checkpoints against a real GCS-API server (gcp-storage-emulator on 127.0.0.1,
tests/gcs_emulator.py): the upload writes every file of the checkpoint and Psyche's
manifest.json with their sizes and generations; a download gives back the same bytes and a
model with the same weights; a missing or empty location is one clear line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from gcs_emulator import gcs_emulator
from google.cloud import storage
from training_assets import TINY_MODEL

from client_image.training import CheckpointError, load_causal_lm, save_checkpoint
from client_image.training.gcs_checkpoint import (
    download_checkpoint_from_gcs,
    upload_checkpoint_to_gcs,
)


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[storage.Client]:
    with gcs_emulator(monkeypatch) as client:
        yield client


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = load_causal_lm(TINY_MODEL, device="cpu")
    return save_checkpoint(model, tmp_path_factory.mktemp("ckpt"), "run-g", 4,
                           tokenizer_dir=TINY_MODEL)


def test_upload_writes_every_file_and_psyches_manifest(
        gcs: storage.Client, checkpoint: Path) -> None:
    gcs.create_bucket("ckpts")
    upload = upload_checkpoint_to_gcs(checkpoint, "ckpts", "runs/g", run_id="run-g", epoch=2,
                                      step=4)
    files = sorted(p.name for p in checkpoint.iterdir())
    assert "model.safetensors" in files and "config.json" in files
    objects = {blob.name: (blob.size, blob.generation) for blob in gcs.list_blobs("ckpts")}
    assert sorted(objects) == sorted([f"runs/g/{name}" for name in files] + ["runs/g/manifest.json"])
    manifest = json.loads(gcs.bucket("ckpts").blob("runs/g/manifest.json").download_as_bytes())
    assert manifest == upload.manifest
    assert upload.manifest_generation == objects["runs/g/manifest.json"][1]
    metadata = manifest["metadata"]
    assert (metadata["epoch"], metadata["step"], metadata["run_id"]) == (2, 4, "run-g")
    assert metadata["timestamp"].endswith("Z")
    assert [entry["filename"] for entry in manifest["files"]] == files
    for entry in manifest["files"]:
        size, generation = objects[f"runs/g/{entry['filename']}"]
        assert entry["size_bytes"] == size == (checkpoint / entry["filename"]).stat().st_size
        assert entry["generation"] == generation


def test_a_download_gives_back_the_same_checkpoint(
        gcs: storage.Client, checkpoint: Path, tmp_path: Path) -> None:
    gcs.create_bucket("ckpts")
    upload_checkpoint_to_gcs(checkpoint, "ckpts", "g", run_id="run-g", epoch=0, step=4)
    path = download_checkpoint_from_gcs("ckpts", "g", tmp_path / "cache")
    assert path == tmp_path / "cache" / "ckpts" / "g" / "step4"
    assert sorted(p.name for p in path.iterdir()) == sorted(
        [p.name for p in checkpoint.iterdir()] + ["manifest.json"])  # kept to check the cache
    for file in checkpoint.iterdir():
        assert (path / file.name).read_bytes() == file.read_bytes()
    original, loaded = load_causal_lm(checkpoint, device="cpu"), load_causal_lm(path, device="cpu")
    for (name, a), (_, b) in zip(original.state_dict().items(), loaded.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_without_a_manifest_the_objects_under_the_prefix_are_the_checkpoint(
        gcs: storage.Client, checkpoint: Path, tmp_path: Path) -> None:
    bucket = gcs.create_bucket("bare")
    for file in checkpoint.iterdir():
        bucket.blob(file.name).upload_from_filename(str(file))
    bucket.blob("older/model.safetensors").upload_from_string(b"another checkpoint")
    path = download_checkpoint_from_gcs("bare", None, tmp_path)
    assert path == tmp_path / "bare" / "latest"
    assert sorted(p.name for p in path.iterdir()) == sorted(p.name for p in checkpoint.iterdir())
    assert (path / "model.safetensors").read_bytes() == (
        checkpoint / "model.safetensors").read_bytes()


def test_missing_locations_and_vanished_files_are_one_line_errors(
        gcs: storage.Client, checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as missing:
        download_checkpoint_from_gcs("absent", "p", tmp_path)
    assert str(missing.value) == "gs://absent/p: not found"
    gcs.create_bucket("ckpts")
    with pytest.raises(CheckpointError) as empty:
        download_checkpoint_from_gcs("ckpts", "nothing-here", tmp_path)
    assert str(empty.value) == "gs://ckpts/nothing-here holds no checkpoint (no config.json)"
    with pytest.raises(CheckpointError) as upload:
        upload_checkpoint_to_gcs(checkpoint, "absent", None, run_id="r", epoch=0, step=4)
    assert str(upload.value).startswith(f"uploading {checkpoint.name} to gs://absent: ")
    assert "\n" not in str(upload.value)
    upload_checkpoint_to_gcs(checkpoint, "ckpts", "p", run_id="r", epoch=0, step=4)
    gcs.bucket("ckpts").blob("p/config.json").delete()
    with pytest.raises(CheckpointError) as vanished:
        download_checkpoint_from_gcs("ckpts", "p", tmp_path)
    assert str(vanished.value) == "gs://ckpts/p/config.json: not found"
    # A later upload under way (a new model file, no manifest yet) is never mixed in.
    upload_checkpoint_to_gcs(checkpoint, "ckpts", "p", run_id="r", epoch=0, step=4)
    gcs.bucket("ckpts").blob("p/model.safetensors").upload_from_string(b"half-written")
    with pytest.raises(CheckpointError, match=r"^gs://ckpts/p/model.safetensors: (12 bytes, "
                       r"the manifest says \d+ \(replaced by a later upload\?\)|not found)$"):
        download_checkpoint_from_gcs("ckpts", "p", tmp_path)
    assert [p.name for p in (tmp_path / "ckpts" / "p").iterdir()] == []  # no staging left


def test_a_step_uploaded_again_with_other_weights_is_not_served_from_the_cache(
        gcs: storage.Client, checkpoint: Path, tmp_path: Path) -> None:
    gcs.create_bucket("again")
    cache = tmp_path / "cache"
    upload_checkpoint_to_gcs(checkpoint, "again", "r", run_id="run-g", epoch=1, step=4)
    first = download_checkpoint_from_gcs("again", "r", cache)
    assert (first / "model.safetensors").read_bytes() == (
        checkpoint / "model.safetensors").read_bytes()
    # The same step again (a run restarted from an earlier step): same names and sizes,
    # other weights. The cached copy of the first upload must not be what loads.
    other = tmp_path / "other"
    other.mkdir()
    for file in checkpoint.iterdir():
        data = file.read_bytes()
        if file.name == "model.safetensors":
            data = data[:-4] + bytes(b ^ 0xFF for b in data[-4:])
        (other / file.name).write_bytes(data)
    upload_checkpoint_to_gcs(other, "again", "r", run_id="run-g", epoch=3, step=4)
    second = download_checkpoint_from_gcs("again", "r", cache)
    assert (second / "model.safetensors").read_bytes() == (
        other / "model.safetensors").read_bytes()
    # Unchanged since: served from the cache, same files.
    assert download_checkpoint_from_gcs("again", "r", cache) == second
