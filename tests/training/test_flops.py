"""MFU as nanoGPT counts it (client_image/training/flops.py), on real transformers models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from client_image.training.flops import (
    device_slug,
    flops_per_token,
    mfu,
    model_flops_per_token,
    non_embedding_params,
    peak_bf16_flops,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _meta_llama(*, tie_word_embeddings: bool) -> torch.nn.Module:
    config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=tie_word_embeddings)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_llama_1b_counts_its_published_parameters_and_nanogpt_attention_term() -> None:
    """Llama 3.2 1B ties its head to the embedding: all 1,235,814,400 parameters are
    multiplied by (the head is the embedding used as a matmul), plus 12 L H Q T."""
    config = AutoConfig.from_pretrained(REPO_ROOT / "config" / "models" / "llama-1b")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert non_embedding_params(model) == 1_235_814_400
    assert model_flops_per_token(model, 2048) == 6 * 1_235_814_400 + 12 * 16 * 32 * 64 * 2048


def test_an_untied_input_embedding_is_left_out() -> None:
    untied = _meta_llama(tie_word_embeddings=False)
    tied = _meta_llama(tie_word_embeddings=True)
    total_untied = sum(p.numel() for p in untied.parameters())
    assert non_embedding_params(untied) == total_untied - 1000 * 64
    # tied: the one table is the head's matmul weight, counted once
    assert non_embedding_params(tied) == sum(p.numel() for p in tied.parameters())
    assert non_embedding_params(tied) == non_embedding_params(untied)


def test_flops_per_token_formula() -> None:
    # nanoGPT's GPT-2 124M at block size 1024: 6 N + 12 x 12 layers x 12 heads x 64 x 1024
    assert flops_per_token(85_000_000, 12, 12, 64, 1024) == 6 * 85_000_000 + 113_246_208


@pytest.mark.parametrize(("name", "peak", "slug"), [
    ("NVIDIA H100 80GB HBM3", 989e12, "h100"),
    ("NVIDIA H100 PCIe", 756e12, "h100-pcie"),
    ("NVIDIA H200", 989e12, "h200"),
    ("NVIDIA A100-SXM4-80GB", 312e12, "a100"),
    ("NVIDIA L40S", 362e12, "l40s"),
    ("NVIDIA GeForce RTX 4090", 165.2e12, "rtx-4090"),
    ("Tesla T4", None, "tesla-t4"),
])
def test_peaks_and_slugs(name: str, peak: float | None, slug: str) -> None:
    assert peak_bf16_flops(name) == peak
    assert device_slug(name) == slug


def test_mfu_is_null_without_a_peak() -> None:
    assert mfu(1000, 2.0, None) is None
    assert mfu(1000, 2.0, 4000.0) == pytest.approx(0.5)
