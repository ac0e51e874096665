"""Psyche's `upload-data` and `download-results` on our storage: Google Cloud Storage.

Psyche's commands ask its run-down service for signed URLs; ours talk to GCS directly
with google-cloud-storage (GOOGLE_APPLICATION_CREDENTIALS for private buckets, anonymous
otherwise; STORAGE_EMULATOR_HOST points it at a GCS-API emulator). Where things go is
read from the run on chain when `-r` is given:
- upload-data: the run's data location `Http { location = Gcp { bucket_name,
  filter_directory } }`, or --bucket/--prefix;
- download-results: the run's Gcs or P2PGcs checkpoint (bucket, prefix), or
  --bucket/--prefix: the files named by its manifest.json (written by our clients, as
  Psyche's), sizes checked, else every object directly under the prefix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from run_manager.commands.solana_common import (
    EXIT_BAD_ARGUMENT,
    EXIT_FAILED,
    LOCALNET_URL,
    ProgramId,
    Rpc,
    Rpc2,
    TreasurerIndex,
    fail,
    run_rpc,
)

STORAGE_PANEL = "Run data (Google Cloud Storage)"
MANIFEST = "manifest.json"
OptionalRunId = Annotated[str | None, typer.Option(
    "--run-id", "-r", help="Take the bucket and prefix from this run on chain.")]
Bucket = Annotated[str | None, typer.Option(help="GCS bucket (instead of -r).")]
Prefix = Annotated[str | None, typer.Option(help="Folder in the bucket (with --bucket).")]


def _storage_client() -> Any:
    from google.cloud import storage

    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return storage.Client()
    return storage.Client.create_anonymous_client()


def _gcs_failure(error: BaseException, what: str) -> typer.Exit:
    """One line for a GCS failure (its API errors carry the whole HTTP response)."""
    from google.api_core import exceptions

    if isinstance(error, exceptions.NotFound):
        return fail(f"{what}: not found")
    if isinstance(error, exceptions.Forbidden | exceptions.Unauthorized):
        return fail(f"{what}: access denied (set GOOGLE_APPLICATION_CREDENTIALS)")
    return fail(f"{what}: {type(error).__name__}: {' '.join(str(error).split())[:300]}")


def _object(prefix: str, name: str) -> str:
    return f"{prefix.strip('/')}/{name}" if prefix.strip("/") else name


def _location(run_id: str | None, bucket: str | None, prefix: str | None, rpc: str,
              rpc_2: str | None, program_id: str | None, treasurer_index: int | None,
              of_run: Any) -> tuple[str, str]:
    """(bucket, prefix) from --bucket/--prefix, or `of_run(run_id, state)` on chain."""
    from psyche_solana.runs import find_run

    if (run_id is None) == (bucket is None):
        raise fail("give exactly one of -r/--run-id and --bucket", EXIT_BAD_ARGUMENT)
    if bucket is not None:
        return bucket, prefix or ""
    if prefix is not None:
        raise fail("--prefix goes with --bucket (with -r the run names it)", EXIT_BAD_ARGUMENT)
    assert run_id is not None  # exactly one of run_id and bucket, checked above
    run = run_rpc(rpc, rpc_2, program_id, lambda c: find_run(c, run_id, treasurer_index))
    if run.account.state is None:
        raise fail(f"run {run_id!r} has no config yet (update-config)")
    found: tuple[str, str] = of_run(run_id, run.account.state)
    return found


def _data_location(run_id: str, state: Any) -> tuple[str, str]:
    from coordinator.data_location import GcpBucket

    location = getattr(state.model.data_location, "location", None)
    if not isinstance(location, GcpBucket):
        raise fail(f"run {run_id!r} reads its data from {type(state.model.data_location).__name__}"
                    ", not a GCS bucket: give --bucket")
    return location.bucket_name, location.filter_directory


def _checkpoint_location(run_id: str, state: Any) -> tuple[str, str]:
    from coordinator.config import GcsCheckpoint, P2PGcsCheckpoint

    checkpoint = state.model.checkpoint
    if not isinstance(checkpoint, GcsCheckpoint | P2PGcsCheckpoint):
        where = getattr(checkpoint, "repo_id", "")
        raise fail(f"run {run_id!r} keeps its checkpoints as {type(checkpoint).__name__}"
                    + (f" ({where} on the Hugging Face Hub)" if where else "")
                    + ", not in GCS: give --bucket")
    return checkpoint.bucket, checkpoint.prefix or ""


def upload_data(path: Annotated[Path, typer.Argument(help="A file or a folder (recursive).")],
                run_id: OptionalRunId = None, bucket: Bucket = None, prefix: Prefix = None,
                rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None, program_id: ProgramId = None,
                treasurer_index: TreasurerIndex = None) -> None:
    """Upload training data to the run's GCS data bucket (or --bucket)."""
    if not path.exists():
        raise fail(f"{path}: no such file or folder", EXIT_BAD_ARGUMENT)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    if not files:
        raise fail(f"{path}: no files to upload", EXIT_BAD_ARGUMENT)
    target, folder = _location(run_id, bucket, prefix, rpc, rpc_2, program_id, treasurer_index,
                               _data_location)
    where = f"gs://{target}/{folder.strip('/')}".rstrip("/")
    sent = 0
    try:
        destination = _storage_client().bucket(target)
        for file in files:
            relative = file.name if file == path else file.relative_to(path).as_posix()
            destination.blob(_object(folder, relative)).upload_from_filename(str(file))
            sent += file.stat().st_size
    except OSError as error:
        raise fail(f"uploading to {where}: {error}") from None
    except Exception as error:
        raise _gcs_failure(error, f"uploading to {where}") from None
    typer.echo(f"uploaded {len(files)} file(s), {sent} bytes, to {where}")


def download_results(run_id: OptionalRunId = None, bucket: Bucket = None, prefix: Prefix = None,
                     output_dir: Annotated[Path, typer.Option(
                         help="Where the checkpoint folder goes.")] = Path(),
                     rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None, program_id: ProgramId = None,
                     treasurer_index: TreasurerIndex = None) -> None:
    """Download a run's latest checkpoint from its GCS bucket (or --bucket)."""
    source, folder = _location(run_id, bucket, prefix, rpc, rpc_2, program_id, treasurer_index,
                               _checkpoint_location)
    where = f"gs://{source}/{folder.strip('/')}".rstrip("/")
    try:
        storage = _storage_client().bucket(source)
        manifest_blob = storage.blob(_object(folder, MANIFEST))
        manifest = None
        if manifest_blob.exists():
            manifest = _manifest(manifest_blob.download_as_bytes(), where)
            wanted = {entry["filename"]: entry.get("size_bytes") for entry in manifest["files"]}
        else:
            listed = storage.list_blobs(prefix=_object(folder, ""), delimiter="/")
            wanted = {blob.name.rsplit("/", 1)[-1]: blob.size for blob in listed}
        if not wanted:
            raise fail(f"{where}: no checkpoint files there", EXIT_FAILED)
        step = manifest["metadata"].get("step") if manifest else None
        name = f"{run_id or source}-step{step}" if step is not None else f"{run_id or source}-latest"
        target = output_dir / name
        target.mkdir(parents=True, exist_ok=True)
        for filename, size in sorted(wanted.items()):
            if "/" in filename or filename in ("", ".", ".."):
                raise fail(f"{where}/{MANIFEST}: refusing the file name {filename!r}")
            local = target / filename
            storage.blob(_object(folder, filename)).download_to_filename(str(local))
            if size is not None and local.stat().st_size != size:
                raise fail(f"{where}/{filename}: {local.stat().st_size} bytes, expected {size}")
        if manifest is not None:
            (target / MANIFEST).write_text(json.dumps(manifest, indent=2))
    except typer.Exit:
        raise
    except OSError as error:
        raise fail(f"downloading from {where}: {error}") from None
    except Exception as error:
        raise _gcs_failure(error, f"downloading from {where}") from None
    typer.echo(f"downloaded {len(wanted)} file(s) from {where} to {target}")


def _manifest(raw: bytes, where: str) -> dict[str, Any]:
    """Psyche's manifest: {metadata {step, ...}, files [{filename, size_bytes, ...}]}."""
    try:
        manifest = json.loads(raw)
        files = manifest["files"]
        if not isinstance(manifest["metadata"], dict) or not all(
                isinstance(entry["filename"], str) for entry in files):
            raise TypeError("bad field types")
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise fail(f"{where}/{MANIFEST} is not a checkpoint manifest ({error})") from None
    return dict(manifest)


def register(app: typer.Typer) -> None:
    app.command("upload-data", rich_help_panel=STORAGE_PANEL)(upload_data)
    app.command("download-results", rich_help_panel=STORAGE_PANEL)(download_results)
