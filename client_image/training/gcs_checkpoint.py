"""Gcs checkpoints (docs/data-and-checkpoints.md, "Checkpoints"): a checkpoint directory
in a GCS bucket, as Psyche's cooldown uploads it and its warm-up downloads it.

    upload_checkpoint_to_gcs(path, bucket, prefix, *, run_id, epoch, step, client=None)
        -> GcsUpload(manifest, manifest_generation)
    download_checkpoint_from_gcs(bucket, prefix, cache_dir=None, *, client=None) -> Path
    object_name(prefix, filename) ; gcs_location(bucket, prefix) ; default_cache_dir()
    MANIFEST = "manifest.json"

Upload: every file of the checkpoint directory (the same files as the Hub upload) goes to
`{prefix}/{filename}` (`{filename}` without a prefix), then Psyche's `manifest.json`:
`{"metadata": {"timestamp", "epoch", "step", "run_id"}, "files": [{"filename",
"generation", "size_bytes"}]}`, the generation being the one each upload created. The
manifest goes last, so a reader never finds one naming files not yet there.

Download: the files the manifest names, at its generations, sizes checked: a file that a
later upload has replaced since is an error (its generation is gone, or its size differs),
never silently mixed in; without a manifest, every object directly under the prefix.
They land in `{cache_dir}/{bucket}/{prefix}/step{step}` with the manifest (`latest`
without one, downloaded again each time), written under a staging name and renamed. A
step already there is not downloaded again while the bucket's manifest is byte-for-byte
the one kept with it (the same step uploaded again, by a run restarted from an earlier
step or another run on the prefix, is downloaded afresh). A missing bucket, an empty
prefix or a file that vanished is one CheckpointError line.

The client is client_image/gcs.py `storage_client()`: anonymous unless
GOOGLE_APPLICATION_CREDENTIALS is set (uploading needs it); STORAGE_EMULATOR_HOST honoured.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client_image.gcs import gcs_problem, storage_client
from client_image.training.checkpoint import CheckpointError

if TYPE_CHECKING:
    from google.cloud.storage import Client

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class GcsUpload:
    manifest: dict[str, Any]
    manifest_generation: int


def object_name(prefix: str | None, filename: str) -> str:
    """Where `filename` of a checkpoint goes in the bucket (Psyche's `prefix/filename`)."""
    return f"{prefix.rstrip('/')}/{filename}" if prefix else filename


def gcs_location(bucket: str, prefix: str | None) -> str:
    """`gs://bucket/prefix`, for messages and events."""
    return f"gs://{bucket}/{prefix.rstrip('/')}" if prefix else f"gs://{bucket}"


def default_cache_dir() -> Path:
    """Where downloaded Gcs checkpoints are kept: $XDG_CACHE_HOME/psyche/gcs (~/.cache)."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "psyche" / "gcs"


def upload_checkpoint_to_gcs(path: str | Path, bucket: str, prefix: str | None, *, run_id: str,
                             epoch: int, step: int, client: Client | None = None) -> GcsUpload:
    """Upload the checkpoint directory `path` and its manifest (blocking)."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} is not a checkpoint (no config.json)")
    where = gcs_location(bucket, prefix)
    gcs = client if client is not None else storage_client()
    target = gcs.bucket(bucket)
    files = []
    try:
        for file in sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST):
            blob = target.blob(object_name(prefix, file.name))
            blob.upload_from_filename(str(file))
            files.append({"filename": file.name, "generation": int(blob.generation or 0),
                          "size_bytes": file.stat().st_size})
        manifest = {
            "metadata": {"timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                         "epoch": epoch, "step": step, "run_id": run_id},
            "files": files,
        }
        blob = target.blob(object_name(prefix, MANIFEST))
        blob.upload_from_string(json.dumps(manifest, indent=2), content_type="application/json")
    except Exception as exc:
        raise CheckpointError(gcs_problem(exc, f"uploading {folder.name} to {where}")) from None
    return GcsUpload(manifest, int(blob.generation or 0))


def download_checkpoint_from_gcs(bucket: str, prefix: str | None,
                                 cache_dir: str | Path | None = None, *,
                                 client: Client | None = None) -> Path:
    """Download the checkpoint at `gs://bucket/prefix` into the cache; its directory (blocking)."""
    where = gcs_location(bucket, prefix)
    gcs = client if client is not None else storage_client()
    source = gcs.bucket(bucket)
    try:
        manifest_blob = source.blob(object_name(prefix, MANIFEST))
        manifest_bytes = b""
        if manifest_blob.exists():
            manifest_bytes = manifest_blob.download_as_bytes()
            manifest = _read_manifest(manifest_bytes, where)
            wanted = [(entry["filename"], entry["generation"], entry["size_bytes"])
                      for entry in manifest["files"]]
            name = f"step{manifest['metadata']['step']}"
        else:
            listed = gcs.list_blobs(bucket, prefix=object_name(prefix, ""))
            under = object_name(prefix, "")
            wanted = [(blob.name[len(under):], None, blob.size) for blob in listed
                      if "/" not in blob.name[len(under):]]
            name = "latest"
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(gcs_problem(exc, where)) from None
    if not any(filename == "config.json" for filename, _, _ in wanted):
        raise CheckpointError(f"{where} holds no checkpoint (no config.json)")
    final = Path(cache_dir or default_cache_dir()) / bucket / (prefix or "").strip("/") / name
    for filename, _, _ in wanted:
        if "/" in filename or filename.startswith("."):
            raise CheckpointError(f"{where}/{MANIFEST}: bad file name {filename!r}")
    if name != "latest" and _complete(final, wanted) and _same_manifest(final, manifest_bytes):
        return final  # downloaded before (the same manifest: files and generations)
    final.parent.mkdir(parents=True, exist_ok=True)
    # A staging directory of its own: clients sharing a machine may download at once.
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=final.parent))
    try:
        for filename, generation, size in wanted:
            local = staging / filename
            try:
                source.blob(object_name(prefix, filename),
                            generation=generation).download_to_filename(str(local))
            except Exception as exc:
                raise CheckpointError(gcs_problem(exc, f"{where}/{filename}")) from None
            got = local.stat().st_size
            if size is not None and got != int(size):
                raise CheckpointError(f"{where}/{filename}: {got} bytes, the manifest says "
                                      f"{size} (replaced by a later upload?)")
        if manifest_bytes:
            # Kept with the files: a later download of the same step is served from here
            # only if the bucket's manifest is still this one (a step can be uploaded
            # again with other weights: a run restarted from an earlier step, another
            # run on the same prefix).
            (staging / MANIFEST).write_bytes(manifest_bytes)
        stale = final.exists() and not (manifest_bytes and _same_manifest(final, manifest_bytes))
        if name == "latest" or stale:  # replace it (set aside first: one step)
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(final.rename(final.with_name(f"{staging.name}.old")))
        with contextlib.suppress(OSError):  # else another client just put the same there
            staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _complete(directory: Path, wanted: list[tuple[str, int | None, int | None]]) -> bool:
    return all((directory / filename).is_file()
               and (size is None or (directory / filename).stat().st_size == size)
               for filename, _, size in wanted)


def _same_manifest(directory: Path, manifest: bytes) -> bool:
    try:
        return (directory / MANIFEST).read_bytes() == manifest
    except OSError:
        return False


def _read_manifest(data: bytes, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(data)
        for entry in manifest["files"]:
            if not (isinstance(entry["filename"], str) and isinstance(entry["generation"], int)
                    and isinstance(entry["size_bytes"], int)):
                raise TypeError("a files entry")
        int(manifest["metadata"]["step"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{where}/{MANIFEST} is not Psyche's manifest: {exc}") from None
    return dict(manifest)


__all__ = ["MANIFEST", "GcsUpload", "default_cache_dir", "download_checkpoint_from_gcs",
           "gcs_location", "object_name", "upload_checkpoint_to_gcs"]
