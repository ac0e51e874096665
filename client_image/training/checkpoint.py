"""Checkpoints (docs/data-and-checkpoints.md, "Checkpoints"):
`{checkpoint_dir}/{run_id}-step{step}/`, transformers-loadable.

A checkpoint directory holds config.json, generation_config.json, safetensors weights (in
the model's dtype, so that it loads back bit-identically) and the tokenizer files copied
from the model's source. It is written under a temporary name and renamed, so a crash
never leaves a half-written checkpoint under the final name. The newest `keep_steps`
checkpoints of a run are kept, older ones deleted. Hub upload is a separate, optional call.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "tokenizer.model", "vocab.json", "merges.txt",
)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, found or uploaded."""


def checkpoint_name(run_id: str, step: int) -> str:
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise CheckpointError(f"run id {run_id!r} cannot name a checkpoint directory")
    return f"{run_id}-step{step}"


def list_checkpoints(checkpoint_dir: Path, run_id: str) -> list[tuple[int, Path]]:
    """(step, path) of a run's checkpoints, oldest first."""
    pattern = re.compile(rf"^{re.escape(run_id)}-step(\d+)$")
    found = []
    if checkpoint_dir.is_dir():
        for path in checkpoint_dir.iterdir():
            match = pattern.match(path.name)
            if match and path.is_dir():
                found.append((int(match.group(1)), path))
    return sorted(found)


def save_checkpoint(
    model: torch.nn.Module,
    checkpoint_dir: str | Path,
    run_id: str,
    step: int,
    *,
    tokenizer_dir: str | Path | None = None,
    keep_steps: int = 3,
) -> Path:
    """Write the checkpoint of `step`, then delete all but the newest `keep_steps`."""
    if keep_steps < 1:
        raise CheckpointError(f"keep_steps must be >= 1, got {keep_steps}")
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(run_id, step)
    staging = root / f".{final.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    # nn.Module types `model.save_pretrained` as Tensor | Module; checkpoints are of
    # transformers models (load_causal_lm), whose save_pretrained this is.
    cast("PreTrainedModel", model).save_pretrained(staging, safe_serialization=True)
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            source = Path(tokenizer_dir) / name
            if source.is_file():
                shutil.copy2(source, staging / name)
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    for old_step, path in list_checkpoints(root, run_id)[:-keep_steps]:
        logger.info("deleting old checkpoint of step %d: %s", old_step, path)
        shutil.rmtree(path)
    return final


class HubUploader(Protocol):
    """The part of huggingface_hub.HfApi that uploads a checkpoint."""

    def upload_folder(self, *, repo_id: str, folder_path: str, repo_type: str | None = None,
                      revision: str | None = None, commit_message: str | None = None) -> Any: ...


def upload_checkpoint(
    path: str | Path,
    repo_id: str,
    step: int,
    *,
    token: str | None = None,
    revision: str | None = None,
    api: HubUploader | None = None,
) -> str:
    """Upload a checkpoint directory to the hub; returns the commit id (Psyche's revision)."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} is not a checkpoint (no config.json)")
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    assert api is not None
    info = api.upload_folder(
        folder_path=str(folder), repo_id=repo_id, repo_type="model",
        revision=revision, commit_message=f"step {step}",
    )
    return str(getattr(info, "oid", info))
