"""What the memory plan needs of a model, read from its config alone: the model on the
meta device, no weights.

A transformers config (a config.json file, a directory holding one, or a hub repo whose
config.json is read from the HF cache or the hub) is instantiated on the meta device
(shapes, no storage: an 8 B model costs nothing), and `describe_model` records every
trainable parameter's shape, decoder block, tensor-parallel style (parallel.py) and whether
autocast casts it, with the decoder's dimensions. memory_plan.py turns that into bytes per
device.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

    from coordinator.config import StateFile


class PlanError(ValueError):
    """A model or run this planner cannot read; the message is one line for the user."""


@dataclass(frozen=True)
class ParamInfo:
    """One trainable parameter as the layout sees it."""

    name: str
    shape: tuple[int, ...]
    block: int | None  # decoder block index, None for the root (embeddings, norm, head)
    tp_style: Literal["colwise", "rowwise"] | None  # parallel.LLAMA_BLOCK_TP_PLAN
    linear: bool  # a weight or bias of an nn.Linear (autocast casts it)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model: its parameters and a decoder's dimensions."""

    name: str
    params: tuple[ParamInfo, ...]
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    has_blocks: bool  # `model.layers`: FSDP / TP can split it (parallel.decoder_blocks)

    @property
    def n_params(self) -> int:
        return sum(p.numel for p in self.params)


def find_local_dir(repo_id: str, state_path: Path | None) -> Path | None:
    """A checkpoint's repo_id that names a local directory: from the working directory,
    else from the state file's folder and its parents (config/x/state.toml naming
    assets/tiny-llama, relative to the project root)."""
    candidate = Path(repo_id).expanduser()
    if candidate.is_dir():
        return candidate
    if state_path is not None and not candidate.is_absolute():
        for base in state_path.resolve().parents:
            if (base / candidate).is_dir():
                return base / candidate
    return None


def state_model_source(state: StateFile, state_path: Path | None) -> tuple[str, str | None]:
    """(local directory or hub repo id, revision) of the model a state file starts from."""
    from coordinator.config import GcsCheckpoint, P2PGcsCheckpoint

    checkpoint = state.model.checkpoint
    if isinstance(checkpoint, GcsCheckpoint | P2PGcsCheckpoint):
        raise PlanError(f"the run's checkpoint is in the GCS bucket {checkpoint.bucket}: "
                        "pass its config.json with --model-config")
    local = find_local_dir(checkpoint.repo_id, state_path)
    if local is not None:
        return str(local), None
    return checkpoint.repo_id, checkpoint.revision


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _hub_config(repo_id: str, revision: str | None) -> Path:
    """config.json of a hub repo: the HF cache first, then the network unless offline."""
    import logging

    from huggingface_hub import constants, hf_hub_download

    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in (
        "1", "true", "yes", "on")
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)  # its retry warnings would break the one-line error
    try:
        for local_only in (True, False):
            if not local_only and offline:
                break
            try:
                return Path(hf_hub_download(repo_id, "config.json", revision=revision,
                                            local_files_only=local_only))
            except Exception as exc:  # huggingface_hub raises many types for missing repos
                error = exc
    finally:
        hub_logger.setLevel(level)
    where = "in the HF cache (offline)" if offline else "in the HF cache or on the hub"
    raise PlanError(f"the model {repo_id}: no config.json {where} ({_one_line(error)}); "
                    "pass the model's config.json with --model-config")


def load_model_config(source: str | Path, revision: str | None = None) -> Any:
    """A transformers config from a config.json file, a directory holding one, or a hub
    repo id (only its config.json is fetched)."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PlanError(f"{path} has no config.json")
        path = path / "config.json"
    elif not path.exists():
        if str(source).startswith((".", "/", "~")) or str(source).endswith(".json"):
            raise PlanError(f"model config {source} does not exist")
        path = _hub_config(str(source), revision)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as exc:  # JSON, unknown model_type, bad fields: transformers' many types
        raise PlanError(f"transformers cannot read the model config {path}: "
                        f"{_one_line(exc)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def meta_model(config: Any) -> torch.nn.Module:
    """AutoModelForCausalLM.from_config on the meta device: every shape, no storage."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.device("meta"):
            model: torch.nn.Module = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except Exception as exc:  # not a causal LM, inconsistent sizes...
        raise PlanError(f"transformers cannot build a causal LM from the config "
                        f"({getattr(config, 'model_type', '?')}): {_one_line(exc)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return model


def describe_model(model: torch.nn.Module, name: str = "") -> ModelShape:
    """The parameters (in trainable_parameters' order) and dimensions of a (meta) model."""
    import torch

    from client_image.training.parallel import LLAMA_BLOCK_TP_PLAN, ParallelismError, decoder_blocks

    try:
        blocks = decoder_blocks(model)
    except ParallelismError:
        blocks = []
    where: dict[int, tuple[int, str]] = {}
    for index, block in enumerate(blocks):
        for param_name, param in block.named_parameters():
            where[id(param)] = (index, param_name)
    linear = {id(p) for m in model.modules() if isinstance(m, torch.nn.Linear)
              for p in m.parameters(recurse=False)}
    params = []
    for param_name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        block_index, inner = where.get(id(param), (None, ""))
        named = (LLAMA_BLOCK_TP_PLAN.get(inner.rpartition(".")[0])
                 if block_index is not None else None)
        style: Literal["colwise", "rowwise"] | None = (
            "colwise" if named == "colwise" else "rowwise" if named == "rowwise" else None)
        params.append(ParamInfo(param_name, tuple(int(s) for s in param.shape), block_index,
                                style, id(param) in linear))
    config = getattr(model, "config", None)

    def dim(*names: str, default: int = 0) -> int:
        for attr in names:
            value = getattr(config, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        return default

    hidden = dim("hidden_size", "n_embd", "d_model")
    heads = dim("num_attention_heads", "n_head", default=1)
    return ModelShape(
        name=name or type(model).__name__,
        params=tuple(params),
        hidden=hidden,
        layers=dim("num_hidden_layers", "n_layer", default=len(blocks)),
        heads=heads,
        kv_heads=dim("num_key_value_heads", default=heads),
        head_dim=dim("head_dim", default=hidden // heads if heads else 0),
        intermediate=dim("intermediate_size", "n_inner", default=4 * hidden),
        vocab=dim("vocab_size"),
        has_blocks=bool(blocks),
    )


def tp_problem(shape: ModelShape, tp: int) -> str | None:
    """Why T ranks cannot split this model, or None: parallel.check_tp_divides' rule (heads,
    key/value heads and the MLP width must split evenly over T)."""
    if tp == 1:
        return None
    sizes = {"num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
             "intermediate_size": shape.intermediate}
    for name, size in sizes.items():
        if size % tp:
            return f"tensor parallelism {tp} does not divide {name} = {size}"
    return None
