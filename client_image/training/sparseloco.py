"""SparseLoCo math: chunked top-k of the error-fed pseudo-gradient, quantized, averaged.

SparseLoCo (Sarfi, Thérien, Lidin, Belilovsky 2025, arXiv 2508.15706) is DiLoCo with the
outer momentum replaced by a per-worker error-feedback buffer, so that what a worker sends
can be very sparse. Per round t, on every worker r (theta: the shared weights):

    inner loop        theta_r = AdamW_H(theta; the round's data of r)       H inner steps
    pseudo-gradient   Delta_r = theta - theta_r
    error feedback    e_r     = beta * e_r + Delta_r
    compress          g_r     = Q(TopK(e_r))          TopK per block, k = density * block
    residual          e_r     = e_r - g_r             (what was not sent stays for later)
    aggregate         G       = (1 / R) * sum_r g_r   (a coefficient not sent counts as 0)
    outer step        theta   = theta - alpha * G

Blocks are those of DisTrO (`distro.plan_parameter`: a c(R) x c(C) tile of a matrix, a
c(L) run of a vector) but in the weights' own basis: no DCT. Top-k uses DisTrO's rule (the
k largest nonzero magnitudes, ascending index, zeros never sent: `distro.topk_blocks`).

Quantizer Q with b bits per value (b = quant_bits, 2..8), per block with scale
s = max |v| over the block's kept values, L = 2^(b-1) magnitude levels:

    code      = sign bit | m << 1,    m = clamp(round(L * |v| / s) - 1, 0, L - 1)
    value     = (-1)^sign * s * (m + 1) / L

so b = 2 sends the sign and one of two magnitudes (s/2, s). The scale travels as bfloat16
and the residual subtracts the value as dequantized from that bfloat16 scale, so the buffer
forgets exactly what the peers receive. Everything is elementwise or a fixed-order reduction
(max, sum in peer order): every client computes the same G bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from client_image.formats.blocks import BlockPlan, SparseResult
from client_image.training.distro import BlockLayout, from_blocks, plan_parameter, topk_blocks

MIN_QUANT_BITS = 2
MAX_QUANT_BITS = 8


def block_topk(block_numel: int, density: float) -> int:
    """k of a block: density x its size, at least 1 and at most the whole block."""
    return max(1, min(block_numel, math.ceil(density * block_numel - 1e-9)))


def plan_model(named_shapes: Sequence[tuple[str, Sequence[int]]], chunk: int,
               density: float, dense_max_numel: int = 0) -> list[BlockPlan]:
    """DisTrO's block plans with k from the density (it depends only on the block size);
    a tensor of at most `dense_max_numel` elements keeps every coefficient (density 1)."""
    plans = []
    for name, shape in named_shapes:
        block = plan_parameter(name, shape, chunk, 1)
        dense = math.prod(shape) <= dense_max_numel
        k = block.block_numel if dense else block_topk(block.block_numel, density)
        plans.append(plan_parameter(name, shape, chunk, k))
    return plans


@dataclass
class QuantizedBlocks:
    """One group's kept values as sent: per block a bfloat16 scale (0 for an empty block)
    and per slot an integer code (sign | level << 1); `values` is what they dequantize to
    (float32, 0 in an empty slot)."""

    idx: torch.Tensor  # (N, k) int64
    scale: torch.Tensor  # (N,) bfloat16
    code: torch.Tensor  # (N, k) int64
    values: torch.Tensor  # (N, k) float32


def quantize(idx: torch.Tensor, val: torch.Tensor, bits: int) -> QuantizedBlocks:
    """Q of one group's top-k values (val (N, k) float32, 0 = empty slot)."""
    if not MIN_QUANT_BITS <= bits <= MAX_QUANT_BITS:
        raise ValueError(f"quant_bits must be {MIN_QUANT_BITS}..{MAX_QUANT_BITS}, got {bits}")
    levels = 1 << (bits - 1)
    magnitude = val.abs().float()
    scale = magnitude.amax(dim=1).to(torch.bfloat16)
    safe = scale.float().clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(1)
    level = torch.round(magnitude * levels / safe).clamp(1, levels).to(torch.int64) - 1
    negative = torch.signbit(val).to(torch.int64)
    code = torch.where(val != 0, negative | (level << 1), 0)
    return QuantizedBlocks(idx, scale, code, dequantize(code, scale, val != 0, bits))


def dequantize(code: torch.Tensor, scale: torch.Tensor, sent: torch.Tensor,
               bits: int) -> torch.Tensor:
    """value = (-1)^sign * s * (m + 1) / L for the sent slots, 0 elsewhere."""
    levels = 1 << (bits - 1)
    sign = 1.0 - 2.0 * (code & 1).to(torch.float32)
    magnitude = ((code >> 1) + 1).to(torch.float32) / levels
    value = sign * magnitude * scale.float().unsqueeze(1)
    return torch.where(sent, value, 0.0)


def compress_error(error: Sequence[torch.Tensor], layout: BlockLayout,
                   bits: int) -> list[QuantizedBlocks]:
    """g = Q(TopK(e)) for every group buffer of the error feedback (N, a, b)."""
    out = []
    for buffer, k in zip(error, layout.group_topk, strict=True):
        idx, val = topk_blocks(buffer, k)
        out.append(quantize(idx, val.float(), bits))
    return out


def subtract_sent(error: Sequence[torch.Tensor], sent: Sequence[QuantizedBlocks]) -> None:
    """e -= g, in place: each kept slot loses its dequantized value."""
    for buffer, group in zip(error, sent, strict=True):
        flat = buffer.view(buffer.shape[0], -1)
        flat.scatter_add_(1, group.idx, -group.values.to(flat.dtype))


def split_groups(groups: Sequence[QuantizedBlocks], layout: BlockLayout) -> list[SparseResult]:
    """Group-wise results -> one SparseResult per parameter (values dequantized)."""
    results = []
    for plan, (group, first) in zip(layout.plans, layout.slots, strict=True):
        g = groups[group]
        rows = slice(first, first + plan.n_blocks)
        results.append(SparseResult(g.idx[rows], g.values[rows]))
    return results


def mean_update(peer_tensors: Sequence[SparseResult], plan: BlockPlan,
                dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """G for one parameter: the sum of the peers' sparse values, in peer order, over R.

    A slot with value 0 is empty and adds nothing. Returns a tensor of the parameter's shape.
    """
    total = torch.zeros(plan.n_blocks, plan.block_numel, dtype=torch.float32, device=device)
    for tensor in peer_tensors:
        total.scatter_add_(1, tensor.idx.to(device), tensor.val.to(device, torch.float32))
    total /= max(1, len(peer_tensors))
    return from_blocks(total.view(plan.n_blocks, *plan.block_shape), plan).to(dtype)
