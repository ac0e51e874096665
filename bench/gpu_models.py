"""The models of the GPU suite (bench/gpu_suite.py), as directories a client can load.

    tiny       assets/tiny-llama (1.9 M parameters, trained weights): the --smoke runs
    125m       a Llama of bench/train_step.py's `--generate 125m` shape, random weights
    llama-1b   config/models/llama-1b (Llama 3.2 1B's config), random weights

A config-only model is given random weights (seeded) and saved as safetensors into a
scratch directory once per process that asks for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "assets" / "tiny-llama"
DATA = ROOT / "assets" / "data" / "train"
VALIDATION = ROOT / "assets" / "data" / "validation"
LLAMA_1B = ROOT / "config" / "models" / "llama-1b"
# bench/train_step.py GENERATED["125m"]: GPT-2 small's width and depth in Llama blocks
LLAMA_125M: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
    "num_attention_heads": 12, "num_key_value_heads": 12, "vocab_size": 32000,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}
NAMES = ("tiny", "125m", "llama-1b")


def model_dir(name: str, scratch: Path, seed: int = 0) -> Path:
    """A directory holding the model `name` with weights (module docstring)."""
    if name == "tiny":
        return TINY
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig
    from transformers.utils import logging as hf_logging

    if name == "125m":
        config = LlamaConfig(**LLAMA_125M)
    elif name == "llama-1b":
        config = AutoConfig.from_pretrained(LLAMA_1B)
    else:
        raise ValueError(f"unknown model {name!r}: use one of {', '.join(NAMES)}")
    directory = scratch / name
    if (directory / "config.json").is_file():
        return directory
    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory
