"""The model of a `checkpoint = { Dummy = { repo_id } }` run: built, never downloaded.

    dummy_causal_lm(repo_id, *, device="cpu") -> torch.nn.Module
    dummy_model_config(repo_id) -> transformers.PretrainedConfig
    DUMMY_SEED, DUMMY_LLAMA

Psyche's clients load a Dummy checkpoint without any download (Psyche builds a
placeholder model of zeros; ours is a real transformers model, so that a Dummy run trains
and checkpoints like any other). The architecture is the config.json of `repo_id` when
that is a local directory holding one (only the config is read: no weights), else
DUMMY_LLAMA, a small built-in Llama (Psyche's config/test leaves repo_id empty). The
weights are transformers' initialisation drawn from a generator seeded with DUMMY_SEED,
in fp32 on the CPU, so every client builds bit-identical weights (what the first epoch's
clients must share; tests/training/test_dummy_model.py checks it). The process's global
random state is left as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, PretrainedConfig

DUMMY_SEED = 0x5EED
# A small Llama (about 0.4 M parameters at a 256-token vocabulary): cheap on any device.
DUMMY_LLAMA: dict[str, Any] = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}


class DummyModelError(ValueError):
    """A Dummy repo_id naming a directory whose config.json cannot be read."""


def dummy_model_config(repo_id: str) -> PretrainedConfig:
    """The architecture of a Dummy checkpoint (module docstring)."""
    directory = Path(repo_id) if repo_id else None
    if directory is not None and (directory / "config.json").is_file():
        try:
            config: PretrainedConfig = AutoConfig.from_pretrained(directory)
        except (OSError, ValueError) as exc:
            raise DummyModelError(
                f"Dummy checkpoint {repo_id}: config.json unreadable: {exc}") from None
        return config
    return LlamaConfig(**DUMMY_LLAMA)


def dummy_causal_lm(repo_id: str, *, device: str = "cpu") -> torch.nn.Module:
    """The Dummy checkpoint's model, its weights a function of its config alone."""
    config = dummy_model_config(repo_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(DUMMY_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(device)


__all__ = ["DUMMY_LLAMA", "DUMMY_SEED", "DummyModelError", "dummy_causal_lm",
           "dummy_model_config"]
