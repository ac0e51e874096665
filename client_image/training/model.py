"""Loading a causal language model (Psyche's HfLlama / HfDeepseek / HfAuto) with transformers.

A source is a local directory holding `config.json` and safetensors weights, or a hub repo
id resolved through huggingface_hub's cache (`local_files_only=True` never touches the
network: how tests and offline machines use it).

`round_to_bf16_` is Psyche's cooldown rounding of the weights kept in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DTypeName = Literal["bf16", "fp32"]
DeviceName = Literal["auto", "cpu", "cuda", "mps"]
_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32}


class ModelLoadError(RuntimeError):
    """The model source is missing, incomplete or not a causal LM."""


def pick_device(name: str) -> torch.device:
    """auto = cuda if present, else mps, else cpu; an explicit device must be available."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device cuda requested but torch sees no CUDA device")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError("device mps requested but torch sees no MPS device")
    if name not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"unknown device {name!r}; use auto, cpu, cuda or mps")
    return torch.device(name)


def resolve_model_dir(
    source: str | Path, *, revision: str | None = None, local_files_only: bool = False
) -> Path:
    """A local directory as is, else a hub repo id downloaded to (or found in) the HF cache."""
    path = Path(source).expanduser()
    if path.is_dir():
        _check_model_dir(path)
        return path
    if path.exists() or str(source).startswith((".", "/", "~")):
        raise ModelLoadError(f"model directory {source} does not exist or is not a directory")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        snapshot = Path(
            snapshot_download(
                repo_id=str(source), revision=revision, local_files_only=local_files_only,
                allow_patterns=["*.json", "*.safetensors", "*.py", "*.model", "*.txt"],
            )
        )
    except HFValidationError as exc:
        raise ModelLoadError(f"{source!r} is neither a directory nor a hub repo id: {exc}") from exc
    except Exception as exc:  # huggingface_hub raises many types for offline/missing repos
        raise ModelLoadError(f"hub repo {source!r} (revision {revision}) unavailable: {exc}") from exc
    _check_model_dir(snapshot)
    return snapshot


def _check_model_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json")
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} has no *.safetensors weights")


def load_causal_lm(
    source: str | Path,
    *,
    dtype: DTypeName = "fp32",
    device: str = "auto",
    revision: str | None = None,
    local_files_only: bool = False,
) -> torch.nn.Module:
    """AutoModelForCausalLM from a directory or hub repo id, in train mode on `device`."""
    from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use bf16 or fp32")
    model_dir = resolve_model_dir(source, revision=revision, local_files_only=local_files_only)
    try:
        # Typed as the nn.Module it is: transformers' decorated `.to` has a broken signature.
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=_DTYPES[dtype])
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load a causal LM from {model_dir}: {exc}") from exc
    model = model.to(pick_device(device))
    model.train()
    return model


def round_to_bf16_(model: torch.nn.Module) -> None:
    """Round every saved floating-point weight to the nearest bf16 value, in place and in
    its own dtype (an fp32 model goes on training in fp32).

    Psyche rounds to bf16 at each cooldown before it checkpoints and shares the model: after
    this the model a client keeps in memory is bit for bit the bf16 checkpoint it writes and
    the bf16 weights it shares, so the clients that kept it and those that load it (from
    peers or from the Hub) continue identically. Non-persistent buffers (RoPE frequencies)
    are recomputed on load, never saved, and so are left alone.
    """
    with torch.no_grad():
        # state_dict() holds detached views of the parameters: copy_ writes through.
        for tensor in model.state_dict().values():
            if tensor.is_floating_point() and tensor.dtype != torch.bfloat16:
                tensor.copy_(tensor.to(torch.bfloat16))


def load_tokenizer(
    source: str | Path, *, revision: str | None = None, local_files_only: bool = False
) -> PreTrainedTokenizerBase:
    """The tokenizer stored beside the model (tokenizer.json)."""
    from transformers import AutoTokenizer

    model_dir = resolve_model_dir(source, revision=revision, local_files_only=local_files_only)
    return AutoTokenizer.from_pretrained(model_dir)
