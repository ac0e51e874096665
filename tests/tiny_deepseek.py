"""A tiny DeepSeek-V3-style MoE checkpoint for tests, generated, never committed.

    write_tiny_deepseek(directory) -> Path
    TINY_DEEPSEEK: the transformers DeepseekV3Config fields used

Two decoder layers: the first dense (first_k_dense_replace = 1), the second a MoE of four
routed experts (two per token, in two groups) plus one shared expert, with MLA attention
(q and kv low-rank projections) of tiny dimensions, hidden 64, and the bundled tokenizer's
vocabulary (assets/tiny-llama). transformers stores the routed experts fused: one
[experts, 2 * moe_intermediate, hidden] gate_up_proj and one [experts, hidden,
moe_intermediate] down_proj per MoE layer. The weights are transformers' initialisation
from a fixed seed, written as real safetensors with the tokenizer beside them, so two
calls write bit-identical checkpoints (a second of CPU).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DeepseekV3Config

TINY_LLAMA = Path(__file__).resolve().parents[1] / "assets" / "tiny-llama"
SEED = 17
TINY_DEEPSEEK: dict[str, Any] = {
    "vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128,
    "moe_intermediate_size": 32, "num_hidden_layers": 2, "first_k_dense_replace": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.0,
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "max_position_embeddings": 1024, "tie_word_embeddings": False,
    "bos_token_id": 0, "eos_token_id": 0,
}


def write_tiny_deepseek(directory: Path) -> Path:
    """The checkpoint written to `directory` (config.json, model.safetensors, tokenizer)."""
    config = DeepseekV3Config(**TINY_DEEPSEEK)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TINY_LLAMA / name, directory / name)
    return directory
