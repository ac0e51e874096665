"""Checkpoints (docs/data-and-checkpoints.md, "Checkpoints"):
`{checkpoint_dir}/{run_id}-step{step}/`, loadable by transformers and by Psyche.

A checkpoint directory holds, as Psyche's cooldown writes it:

- the weights in bf16 (Psyche's checkpoint dtype, whatever dtype the model trains in), as
  `model.safetensors`, or as `model-0000i-of-0000N.safetensors` shards of at most 5 GiB of
  tensors (a bigger tensor alone in its shard) plus `model.safetensors.index.json`;
- `config.json`: every key and value of the source's original config.json, completed with
  what the installed transformers needs (see `checkpoint_config`);
- the source's `generation_config.json`, tokenizer files and `*.py` as they were.

Every file gets the mode of a normally created file (0666 less the umask). The directory is
written under a temporary name and renamed, so a crash or a stop never leaves a half-written
checkpoint under the final name (an abandoned write is a hidden `.NAME.partial`, replaced by
the next write of that step). The newest `keep_steps` checkpoints of a run are kept, older
ones deleted, each renamed to a hidden name first so that none is ever seen half deleted.
Hub upload is a separate, optional call.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from copy import deepcopy
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from safetensors import SafetensorError

from coordinator.checkpoint_reports import is_commit_id

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

logger = logging.getLogger(__name__)

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "tokenizer.model", "vocab.json", "merges.txt",
)
# Copied verbatim from the model's source, as Psyche does (its checkpoint "extra files").
SOURCE_FILES = (*TOKENIZER_FILES, "generation_config.json")
# Psyche's MAX_SAFETENSOR_PART_SIZE: larger checkpoints are split into shards + an index.
MAX_SHARD_BYTES = 5 * 1024**3
CHECKPOINT_DTYPE = torch.bfloat16


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


def model_source_dir(model: torch.nn.Module, given: str | Path | None = None) -> Path | None:
    """The directory holding the model's original config.json: `given`, else the one
    transformers loaded it from (a local directory or hub snapshot: `load_causal_lm` passes
    the resolved directory to from_pretrained), else None (a model built in memory)."""
    if given is not None:
        return Path(given)
    loaded_from = getattr(model, "name_or_path", None)
    if loaded_from and (Path(loaded_from) / "config.json").is_file():
        return Path(loaded_from)
    return None


def checkpoint_config(model: torch.nn.Module, source_dir: str | Path | None = None) -> dict[str, Any]:
    """The config.json of a checkpoint of `model`: what the installed transformers writes,
    overlaid with every key and value of the source's original config.json.

    Both halves are needed. transformers 5 moves `rope_theta`/`rope_scaling` into
    `rope_parameters` and `torch_dtype` into `dtype`, and writes only the new names; Psyche's
    loader and transformers 4 read only the old ones and default a missing `rope_theta` to
    10 000, so a checkpoint of a rope_theta 500 000 model would silently change model. The
    original fields win: transformers derived its own from them, so they describe the same
    model. Where the source itself is in the new layout, the old names are derived from it.
    """
    config = cast("PreTrainedModel", model).config
    written: dict[str, Any] = json.loads(config.to_json_string(use_diff=True))
    source = model_source_dir(model, source_dir)
    original: dict[str, Any] = {}
    if source is not None and (source / "config.json").is_file():
        original = json.loads((source / "config.json").read_text(encoding="utf-8"))
    written.update(original)
    if "torch_dtype" in original and "dtype" not in original:
        # transformers 5 prefers `dtype` to `torch_dtype` (and writes only `dtype`, from the
        # dtype the model was loaded in): make it say what the original says.
        written["dtype"] = original["torch_dtype"]
    rope = written.get("rope_parameters")
    # A flat rope_parameters (one RoPE for all layers) has an old-layout equivalent; models
    # with per-layer-type RoPE have none, and no old reader to serve.
    if isinstance(rope, dict) and "rope_theta" in rope:
        written.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default" and written.get("rope_scaling") is None:
            written["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    _warn_unless_readers_agree(config, written)
    return written


def _warn_unless_readers_agree(config: PretrainedConfig, written: dict[str, Any]) -> None:
    """Only an original config.json that contradicts itself (say `rope_theta` 500 000 beside
    a `rope_parameters` of 10 000) gets here: it is kept as it is, but said out loud."""
    ours = getattr(config, "rope_parameters", None)
    if not isinstance(ours, dict) or "rope_theta" not in ours:
        return
    # A deep copy: transformers standardises the RoPE tables it is given in place.
    reread = getattr(type(config).from_dict(deepcopy(written)), "rope_parameters", None)
    if reread != ours or written.get("rope_theta") != ours["rope_theta"]:
        logger.warning("checkpoint config.json: transformers reads RoPE %s and Psyche rope_theta "
                       "%s, the model in memory uses %s", reread, written.get("rope_theta"), ours)


def bf16_state_dict(model: torch.nn.Module, *, copy: bool = False) -> dict[str, torch.Tensor]:
    """The model's state dict as Psyche saves and shares it: floating-point tensors in bf16
    on the CPU (copies if `copy`, else possibly the model's own bf16 CPU tensors). Tied
    weights (one tensor under two names) stay one tensor, so that save_pretrained
    recognises and drops the alias, as it does for the model's own."""
    converted: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
               tuple(tensor.shape), tuple(tensor.stride()))
        if key not in converted:
            dtype = CHECKPOINT_DTYPE if tensor.is_floating_point() else tensor.dtype
            converted[key] = tensor.detach().to(device="cpu", dtype=dtype, copy=copy)
        state[name] = converted[key]
    return state


def checkpoint_dir_problem(directory: Path) -> str | None:
    """Why checkpoints cannot be written under `directory` (None: they can): a file, a
    directory that cannot be created, or one this process cannot write to (tried with a
    temporary file: permission bits say nothing to root or of a read-only mount)."""
    if directory.exists() and not directory.is_dir():
        return f"{directory} is a file, not a directory"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        return f"{directory}: cannot write there ({exc.strerror or exc})"
    return None


def save_checkpoint(
    model: torch.nn.Module,
    checkpoint_dir: str | Path,
    run_id: str,
    step: int,
    *,
    tokenizer_dir: str | Path | None = None,
    keep_steps: int = 3,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """Write the checkpoint of `step`, then delete all but the newest `keep_steps`.

    `tokenizer_dir` is the model's source directory: its config.json is the original the
    checkpoint's config keeps, and its tokenizer and generation files are copied (default:
    the directory the model was loaded from). The model itself is left as it is: rounding
    the weights kept in memory to bf16 is the cooldown's job (`round_to_bf16_`).

    A write that fails (a full disk, a directory gone or turned read-only) is a
    CheckpointError naming the step, the directory and the cause; its partial files are
    removed, the checkpoints already there are left as they were.
    """
    if keep_steps < 1:
        raise CheckpointError(f"keep_steps must be >= 1, got {keep_steps}")
    root = Path(checkpoint_dir)
    final = root / checkpoint_name(run_id, step)
    staging = root / f".{final.name}.partial"
    try:
        return _write_checkpoint(model, root, final, staging, run_id, tokenizer_dir,
                                 keep_steps, max_shard_bytes)
    except (OSError, SafetensorError) as exc:  # safetensors' own error for a failed write
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(f"the checkpoint of step {step} was not written to {root}: "
                              f"{exc}") from exc


def _write_checkpoint(model: torch.nn.Module, root: Path, final: Path, staging: Path,
                      run_id: str, tokenizer_dir: str | Path | None, keep_steps: int,
                      max_shard_bytes: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    source = model_source_dir(model, tokenizer_dir)
    # nn.Module types `model.save_pretrained` as Tensor | Module; checkpoints are of
    # transformers models (load_causal_lm), whose save_pretrained this is. It handles tied
    # weights, sharding (same file and index names as Psyche's) and writes generation_config.
    cast("PreTrainedModel", model).save_pretrained(
        staging, state_dict=bf16_state_dict(model), max_shard_size=max_shard_bytes)
    config = checkpoint_config(model, source)
    (staging / "config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if source is not None:
        extra = [source / name for name in SOURCE_FILES] + sorted(source.glob("*.py"))
        for path in extra:
            if path.is_file():
                shutil.copyfile(path, staging / path.name)
    give_normal_file_modes(staging)
    replaced = _set_aside(final) if final.exists() else None
    staging.rename(final)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    for old_step, path in list_checkpoints(root, run_id)[:-keep_steps]:
        logger.info("deleting old checkpoint of step %d: %s", old_step, path)
        shutil.rmtree(_set_aside(path))
    return final


def _set_aside(path: Path) -> Path:
    """Rename a checkpoint directory to a hidden name (one atomic step) before deleting
    it: a process stopped while deleting never leaves part of a checkpoint under its name."""
    aside = path.with_name(f".{path.name}.deleting")
    shutil.rmtree(aside, ignore_errors=True)
    path.rename(aside)
    return aside


def read_checkpoint(path: Path) -> tuple[str, str | None, dict[str, torch.Tensor]]:
    """(config.json text, tokenizer.json text or None, bf16 weights under the model's own
    names) of a checkpoint written by `save_checkpoint`: what a peer shares of the same
    model."""
    from safetensors.torch import load_file

    config_json = (path / "config.json").read_text()
    tokenizer = path / "tokenizer.json"
    state: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        state.update(load_file(file))
    if not state:
        raise CheckpointError(f"{path} holds no safetensors weights")
    # Only a checkpoint saved as one tensor per expert can differ from the model's own
    # names; asking transformers (a model built on the meta device) costs its import,
    # seconds in a process that has not loaded it, on the warm-up path of a restart.
    names = _in_memory_names(path) if any(map(_PER_EXPERT.search, state)) else None
    if names is not None and set(state) - names:
        # Saved under other names than the model's own: transformers converts some
        # families on save (DeepSeek-V3's fused experts become one tensor per expert),
        # and only its loader converts them back to what peers share.
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=CHECKPOINT_DTYPE)
        state = bf16_state_dict(model, copy=True)
    return config_json, tokenizer.read_text() if tokenizer.is_file() else None, state


_PER_EXPERT = re.compile(r"\.experts\.\d+\.")  # e.g. mlp.experts.3.gate_proj.weight


def _in_memory_names(path: Path) -> set[str] | None:
    """The state-dict names of the model a checkpoint's config.json builds (no weights);
    None when transformers builds no model from it (the names are then taken as saved)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path)
    except (ValueError, OSError, KeyError):
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return set(model.state_dict())


def give_normal_file_modes(directory: Path) -> None:
    """chmod every file to 0666 less the umask. safetensors (0.8) creates its files 0600
    whatever the umask, and copies could keep their source's mode; a checkpoint is meant to
    be read by others (uploaders, servers, other users), like any file we create.
    The umask is read off a probe file: os.umask can only be read by setting it, which
    would race with files other threads of the client create meanwhile."""
    probe = directory / ".mode-probe"
    os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    mode = probe.stat().st_mode & 0o777
    probe.unlink()
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)


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
    """Upload a checkpoint directory to the hub; returns the commit id (Psyche's revision).

    The id is what the client reports to the coordinator, which takes only a full commit
    id (coordinator/checkpoint_reports.py): an answer without one is a CheckpointError."""
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
    oid = getattr(info, "oid", None)
    if not isinstance(oid, str) or not is_commit_id(oid):
        raise CheckpointError(f"the Hub answered the upload of {folder} to {repo_id} without a "
                              f"commit id (got {oid!r})")
    return oid
