"""Model FLOPs utilization (MFU) as nanoGPT counts it, and the dense bf16 peaks it divides by.

FLOPs of training one token of a decoder (Kaplan et al. 2020, appendix; nanoGPT's
`estimate_mfu`, PaLM appendix B):

    flops_per_token = 6 N + 12 L H Q T

    N   non-embedding parameters: every parameter a matmul multiplies by, i.e. all of them
        but the input embedding table (a lookup, no FLOPs). A tied output head is the
        embedding table used as a matmul, so it is counted (nanoGPT's GPT ties them and
        counts it the same way); an untied head is its own parameter and counted too.
    6   2 FLOPs per multiply-add in the forward pass, twice that in the backward pass
    L H Q T   layers x attention heads x head dimension x sequence length: the attention
        scores and their weighted sum (2 matmuls of T x Q per head and token), forward
        and backward: 12 L H Q T

    mfu = flops_per_token x tokens_per_s / peak

The peak is the device's dense (no 2:4 sparsity) bf16 tensor-core throughput with fp32
accumulation, from the vendors' data sheets. Recomputation (activation checkpointing) is
not counted: MFU measures useful work, so recomputing a forward lowers it.
"""

from __future__ import annotations

import re

import torch

# (substring of torch.cuda.get_device_name(), dense bf16 FLOP/s). The first match wins, so
# a variant comes before its family's name.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM (torch: "NVIDIA H100 80GB HBM3")
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("RTX 4090", 165.2e12),  # fp32 accumulation (330 with fp16 accumulation)
)


def peak_bf16_flops(device_name: str) -> float | None:
    """Dense bf16 FLOP/s of a GPU named `device_name`, or None when it is not in the table."""
    for key, flops in PEAK_BF16_FLOPS:
        if key.lower() in device_name.lower():
            return flops
    return None


def device_slug(device_name: str) -> str:
    """A short file-name-safe label: the table's key (h100, h200, rtx-4090...) when the
    device is in it, else its name in lower-case letters, digits and dashes."""
    for key, _ in PEAK_BF16_FLOPS:
        if key.lower() in device_name.lower():
            return re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower().removeprefix("nvidia ")).strip("-") \
        or "unknown"


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters a matmul multiplies by: all but the input embedding table, which is
    counted when the output head is tied to it (it is then a matmul too)."""
    total = sum(p.numel() for p in model.parameters())
    get_input = getattr(model, "get_input_embeddings", None)
    get_output = getattr(model, "get_output_embeddings", None)
    embedding = get_input() if callable(get_input) else None
    if embedding is None:
        return total
    head = get_output() if callable(get_output) else None
    if head is not None and head.weight is embedding.weight:
        return total
    return total - embedding.weight.numel()


def flops_per_token(non_embedding: int, layers: int, heads: int, head_dim: int,
                    seq_len: int) -> int:
    """6 N + 12 L H Q T (module docstring)."""
    return 6 * non_embedding + 12 * layers * heads * head_dim * seq_len


def model_flops_per_token(model: torch.nn.Module, seq_len: int) -> int:
    """flops_per_token of a transformers decoder, its dimensions read from its config."""
    config = getattr(model, "config", None)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    head_dim = int(getattr(config, "head_dim", 0) or (hidden // heads if heads else 0))
    return flops_per_token(non_embedding_params(model), layers, heads, head_dim, seq_len)


def mfu(flops_per_token_: int, tokens_per_s: float, peak_flops: float | None) -> float | None:
    """Achieved over peak FLOP/s; None without a known peak (a CPU, an unlisted GPU)."""
    if not peak_flops:
        return None
    return flops_per_token_ * tokens_per_s / peak_flops
