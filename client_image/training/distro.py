"""DisTrO math: blockwise DCT, per-block top-k, and the peers' aggregation.

This is DeMo ("Decoupled Momentum Optimization", Peng, Quesnelle, Kingma 2024) as
Psyche implements it (`shared/modeling/src/distro.rs`). Every parameter is cut into
blocks; each block is moved to the frequency domain with an orthonormal 2-D DCT; only the
k largest coefficients of each block are sent.

Chunk size. For a dimension of size s and the configured chunk c_max:

    c(s) = s                          if s < c_max
         = largest divisor of s <= c_max  otherwise   (a prime > c_max gives 1)

DCT basis (DCT-II, orthonormal, = scipy.fft.dct(eye(c), norm='ortho')):

    F_c[i, k] = sigma_k * cos(pi * (2i + 1) * k / (2c)),
    sigma_0 = sqrt(1/c),  sigma_k = sqrt(2/c) for k > 0,      F_c^T F_c = I

Encode. A matrix T of shape (..., R, C) with a = c(R), b = c(C) is viewed as blocks
X_{y,x} of shape (a, b) (y < R/a, x < C/b; leading dimensions are more blocks):

    E_{y,x} = F_a^T X_{y,x} F_b          i.e. E[p,q] = sum_{j,l} X[j,l] F_a[j,p] F_b[l,q]

A vector of length L is a matrix (L, 1): blocks of (a, 1), F_1 = [[1]].

A parameter of more than two dimensions is as many matrices as its leading dimensions
hold: a MoE layer's routed experts fused as [experts, out, in] (transformers' DeepSeek-V3
`mlp.experts.gate_up_proj` and `down_proj`) are `experts` matrices (out, in), each cut
into its own blocks, so that no block mixes two experts and each expert is compressed as
if it were its own nn.Linear. The blocks follow the parameter's memory order (expert by
expert), the same on every client: the wire format and the results are those of the
equivalent 2-D parameters, deterministically.

Token rows apart (`DistroOptimizer.embeddings_per_token`, not Psyche's default): for the
token embedding and the output head, whose rows are tokens, the row basis is the identity
(F_a = I), so a coefficient is one token's frequency along the hidden dimension. A token
no batch touched then has no momentum, sends nothing and is not moved, where the DCT
along rows would spread every block's update over 64 unrelated tokens.

Compress. Per block keep the k = clamp(topk, 1, a*b) coefficients of largest |E|, leaving
out every coefficient that is zero (+0.0 or -0.0): a block with n < k nonzero coefficients
keeps n. The kept ones come first in ascending index order, then k - n empty slots
(index 0, value +0.0), so the result is a pure function of E: which zeros torch.topk picks
on ties is not (it differs between devices). Psyche keeps zeros, and its 1-bit encoding
turns them into +1 (signbit(0) is false): an all-zero momentum (the first step of a
schedule starting at lr 0, an embedding block no token of the batch touched) would publish
+1 for every coefficient and move every weight of the block with no gradient behind it.

Aggregate (decode). Each coefficient is the mean over the peers that sent it; the rest are 0:

    G[p] = sum_{peers that sent p} v / #{peers that sent p}

then the inverse transform X = F_a G F_b^T puts the block back in place. A slot whose value
is zero is an empty slot: it adds nothing and does not count as a sender.

All transforms run as two batched matmuls over every block of every parameter with the
same block shape at once; there is no Python loop over blocks. The DisTrO step that uses
them (its state, the grouping into chunks, the trainers' one implementation) is
distro_step.py.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from functools import lru_cache

import torch

from client_image.formats.blocks import BlockPlan, SparseResult


def chunk_size(dim: int, max_chunk: int) -> int:
    """c(s): the block width used along a dimension of size `dim`."""
    if dim < 1 or max_chunk < 1:
        raise ValueError(f"dimension and chunk must be positive, got {dim} and {max_chunk}")
    if dim < max_chunk:
        return dim
    for candidate in range(max_chunk, 0, -1):
        if dim % candidate == 0:
            return candidate
    raise AssertionError("unreachable: 1 divides every dimension")


@lru_cache(maxsize=64)
def _dct_basis_cpu(size: int) -> torch.Tensor:
    # Built in float64 so that bf16/fp32 copies are correctly rounded.
    i = torch.arange(size, dtype=torch.float64).unsqueeze(1)
    k = torch.arange(size, dtype=torch.float64).unsqueeze(0)
    basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * size))
    sigma = torch.full((size,), math.sqrt(2.0 / size), dtype=torch.float64)
    sigma[0] = math.sqrt(1.0 / size)
    return basis * sigma


def dct_basis(size: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """F_size: the orthonormal DCT-II matrix, columns are frequencies."""
    return _dct_basis_cpu(size).to(device=device, dtype=dtype)


def plan_parameter(name: str, shape: Sequence[int], max_chunk: int, topk: int,
                   mix_rows: bool = True) -> BlockPlan:
    """The BlockPlan of one parameter for a `compression_chunk` and `compression_topk`."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        rows, cols = 1, 1
    elif len(shape) == 1:
        rows, cols = shape[0], 1
    else:
        rows, cols = shape[-2], shape[-1]
    a, b = chunk_size(rows, max_chunk), chunk_size(cols, max_chunk)
    k = max(1, min(topk, a * b))
    return BlockPlan(name, shape, rows, cols, a, b, k, mix_rows)


def plan_model(
    named_shapes: Sequence[tuple[str, Sequence[int]]], max_chunk: int, topk: int,
    token_rows: Collection[str] = (),
) -> list[BlockPlan]:
    """BlockPlans for a model's trainable parameters, in the given (stable) order; the
    parameters named in `token_rows` keep their rows apart (identity row basis)."""
    return [plan_parameter(name, shape, max_chunk, topk, name not in token_rows)
            for name, shape in named_shapes]


def row_basis(size: int, mix_rows: bool, dtype: torch.dtype,
              device: torch.device | str) -> torch.Tensor:
    """F_a: the DCT, or the identity for token rows kept apart."""
    if mix_rows:
        return dct_basis(size, dtype, device)
    return torch.eye(size, dtype=dtype, device=device)


def to_blocks(tensor: torch.Tensor, plan: BlockPlan) -> torch.Tensor:
    """(..., R, C) -> (n_blocks, a, b), blocks in row-major (leading, y, x) order."""
    a, b = plan.block_shape
    view = tensor.reshape(plan.leading, plan.rows // a, a, plan.cols // b, b)
    return view.permute(0, 1, 3, 2, 4).reshape(plan.n_blocks, a, b)


def from_blocks(blocks: torch.Tensor, plan: BlockPlan) -> torch.Tensor:
    """Inverse of to_blocks: (n_blocks, a, b) -> the parameter's shape."""
    a, b = plan.block_shape
    view = blocks.reshape(plan.leading, plan.rows // a, plan.cols // b, a, b)
    return view.permute(0, 1, 3, 2, 4).reshape(plan.shape)


def dct_blocks(blocks: torch.Tensor, mix_rows: bool = True, *,
               out: torch.Tensor | None = None, work: torch.Tensor | None = None
               ) -> torch.Tensor:
    """E = F_a^T X F_b for every block at once, computed as (F_a^T X) F_b.

    `out` (E) and `work` (F_a^T X), shaped like `blocks`, take the results instead of new
    tensors (the same products: matmul's out= gives the same bits); `out` may be `blocks`
    itself where mix_rows (X is read only by the first product)."""
    a, b = blocks.shape[-2:]
    f_b = dct_basis(b, blocks.dtype, blocks.device)
    if not mix_rows:
        return torch.matmul(blocks, f_b, out=out)
    f_a = dct_basis(a, blocks.dtype, blocks.device)
    return torch.matmul(torch.matmul(f_a.T, blocks, out=work), f_b, out=out)


def idct_blocks(coefficients: torch.Tensor, mix_rows: bool = True, *,
                out: torch.Tensor | None = None, work: torch.Tensor | None = None
                ) -> torch.Tensor:
    """X = F_a E F_b^T for every block at once, as (F_a E) F_b^T (F is orthonormal, so this
    inverts dct_blocks). `out` and `work` as in dct_blocks; `out` may be `coefficients`
    where mix_rows."""
    a, b = coefficients.shape[-2:]
    f_b = dct_basis(b, coefficients.dtype, coefficients.device)
    if not mix_rows:
        return torch.matmul(coefficients, f_b.T, out=out)
    f_a = dct_basis(a, coefficients.dtype, coefficients.device)
    return torch.matmul(torch.matmul(f_a, coefficients, out=work), f_b.T, out=out)


def topk_blocks(coefficients: torch.Tensor, k: int, magnitude: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block, the k nonzero coefficients of largest magnitude: (idx (N, k), val (N, k)).

    Each row holds its kept coefficients in ascending index order, then, when the block has
    fewer than k nonzero coefficients, empty slots (index 0, value +0.0) at the end.
    `magnitude` (as many elements as `coefficients`, contiguous) takes |coefficients|
    instead of a new tensor.
    """
    flat = coefficients.reshape(coefficients.shape[0], -1)
    numel = flat.shape[1]
    if magnitude is not None:
        magnitude = magnitude.view(flat.shape)
    _, picked = torch.topk(torch.abs(flat, out=magnitude), k, dim=1, sorted=False)
    val = torch.gather(flat, 1, picked)
    # A zero that topk picked is dropped (sorted after every kept index, then blanked), so
    # neither the tie-breaking among zeros nor the sign of a -0.0 reaches the result.
    key, order = torch.sort(torch.where(val != 0, picked, numel), dim=1)
    kept = key < numel
    idx = torch.where(kept, key, 0)
    return idx, torch.where(kept, torch.gather(val, 1, order), 0)


def scatter_mean(
    indices: Sequence[torch.Tensor], values: Sequence[torch.Tensor], block_numel: int
) -> torch.Tensor:
    """G: each coefficient averaged over the peers that sent it (0 where none did).

    indices[i], values[i]: peer i's (n_blocks, k_i); a zero value is an empty slot, which
    counts as no sender. Returns (n_blocks, block_numel).
    """
    idx = torch.cat(list(indices), dim=1)
    val = torch.cat(list(values), dim=1)
    total = torch.zeros(idx.shape[0], block_numel, dtype=val.dtype, device=val.device)
    count = torch.zeros_like(total)
    total.scatter_add_(1, idx, val)
    count.scatter_add_(1, idx, (val != 0).to(val.dtype))
    return total / count.clamp_min(1)


def block_view(tensor: torch.Tensor, plan: BlockPlan) -> torch.Tensor:
    """A parameter-shaped tensor seen as (leading, R/a, C/b, a, b) blocks, without a copy."""
    a, b = plan.block_shape
    view = tensor.view(plan.leading, plan.rows // a, a, plan.cols // b, b)
    return view.permute(0, 1, 3, 2, 4)


class BlockLayout:
    """Every parameter's blocks, grouped by block shape into one (N, a, b) buffer per group.

    DisTrO keeps its state in this layout, so a whole group is transformed, decayed or
    signed in one call; parameters are touched only through strided views (block_view).
    """

    def __init__(self, plans: Sequence[BlockPlan]) -> None:
        self.plans = list(plans)
        self.shapes: list[tuple[int, int]] = []
        self.group_sizes: list[int] = []
        self.group_topk: list[int] = []
        self.group_mix_rows: list[bool] = []
        self.slots: list[tuple[int, int]] = []  # per plan: (group, first block)
        group_of: dict[tuple[tuple[int, int], bool], int] = {}
        for plan in self.plans:
            key = (plan.block_shape, plan.mix_rows)
            if key not in group_of:
                group_of[key] = len(self.shapes)
                self.shapes.append(plan.block_shape)
                self.group_sizes.append(0)
                self.group_topk.append(plan.topk)  # k depends only on the block size
                self.group_mix_rows.append(plan.mix_rows)
            group = group_of[key]
            self.slots.append((group, self.group_sizes[group]))
            self.group_sizes[group] += plan.n_blocks

    def zeros(self, dtype: torch.dtype, device: torch.device | str) -> list[torch.Tensor]:
        return [
            torch.zeros(n, a, b, dtype=dtype, device=device)
            for n, (a, b) in zip(self.group_sizes, self.shapes, strict=True)
        ]

    def view(self, buffers: Sequence[torch.Tensor], i: int) -> torch.Tensor:
        """Plan i's blocks inside the group buffers, shaped like block_view of the parameter."""
        plan = self.plans[i]
        group, first = self.slots[i]
        a, b = plan.block_shape
        blocks = buffers[group][first : first + plan.n_blocks]
        return blocks.view(plan.leading, plan.rows // a, plan.cols // b, a, b)

    def gather(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Parameter-shaped tensors -> group buffers (one strided copy each)."""
        buffers = self.zeros(tensors[0].dtype, tensors[0].device)
        for i, (tensor, plan) in enumerate(zip(tensors, self.plans, strict=True)):
            self.view(buffers, i).copy_(block_view(tensor, plan))
        return buffers

    def scatter(self, buffers: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Group buffers -> new parameter-shaped tensors."""
        out = []
        for i, plan in enumerate(self.plans):
            tensor = torch.empty(plan.shape, dtype=buffers[0].dtype, device=buffers[0].device)
            block_view(tensor, plan).copy_(self.view(buffers, i))
            out.append(tensor)
        return out

    def add_to(
        self, targets: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor], alpha: float
    ) -> None:
        """targets[i] += alpha * (plan i's blocks), through strided views."""
        for i, (target, plan) in enumerate(zip(targets, self.plans, strict=True)):
            block_view(target, plan).add_(self.view(buffers, i), alpha=alpha)

    def add_from(
        self, buffers: Sequence[torch.Tensor], sources: Sequence[torch.Tensor], alpha: float
    ) -> None:
        """plan i's blocks += alpha * sources[i] (parameter-shaped)."""
        for i, (source, plan) in enumerate(zip(sources, self.plans, strict=True)):
            self.view(buffers, i).add_(block_view(source, plan), alpha=alpha)


def compress_blocks(buffers: Sequence[torch.Tensor], layout: BlockLayout) -> list[SparseResult]:
    """encode + top-k of every group buffer at once, split back per parameter."""
    per_group = [
        topk_blocks(dct_blocks(buffer, mix_rows), k)
        for buffer, k, mix_rows in zip(buffers, layout.group_topk, layout.group_mix_rows,
                                       strict=True)
    ]
    results = []
    for plan, (group, first) in zip(layout.plans, layout.slots, strict=True):
        idx, val = per_group[group]
        results.append(SparseResult(idx[first : first + plan.n_blocks], val[first : first + plan.n_blocks]))
    return results


def sparse_idct_blocks(idx: torch.Tensor, weight: torch.Tensor, a: int, b: int,
                       mix_rows: bool = True, out: torch.Tensor | None = None,
                       work: torch.Tensor | None = None) -> torch.Tensor:
    """X = F_a G F_b^T for blocks G with m nonzeros each (idx = p*b + q, value weight).

    X = sum_m w_m F_a[:, p_m] F_b[:, q_m]^T: a*b*m multiply-adds per block instead of the
    dense a*b*(a+b), so a block holding only a few peers' top-k is cheap to decode.
    `out` ((N, a, b)) takes X instead of a new tensor; `work` (contiguous, at least
    N * m * (2a + b) elements) the gathered basis columns (laid out as without it, so the
    product is the same).
    """
    f_a = row_basis(a, mix_rows, weight.dtype, weight.device)
    f_b = dct_basis(b, weight.dtype, weight.device)
    n, m = idx.shape
    if work is None or work.numel() < n * m * (2 * a + b):
        rows = f_a[:, idx // b].permute(1, 0, 2) * weight.unsqueeze(1)  # (N, a, m)
        cols = f_b[:, idx % b].permute(1, 2, 0)  # (N, m, b)
        return torch.matmul(rows, cols, out=out)
    flat = work.reshape(-1)
    picked_rows, rows_buffer, cols_buffer = (
        flat[:a * n * m].view(a, n, m), flat[a * n * m:2 * a * n * m].view(a, n, m),
        flat[2 * a * n * m:(2 * a + b) * n * m].view(b, n, m))
    torch.index_select(f_a, 1, (idx // b).reshape(-1), out=picked_rows.view(a, n * m))
    rows = torch.mul(picked_rows.permute(1, 0, 2), weight.unsqueeze(1),
                     out=rows_buffer.permute(1, 0, 2))  # (N, a, m), strided as above
    torch.index_select(f_b, 1, (idx % b).reshape(-1), out=cols_buffer.view(b, n * m))
    return torch.matmul(rows, cols_buffer.permute(1, 2, 0), out=out)


def aggregate_blocks(idx: torch.Tensor, val: torch.Tensor, n_peers: int, a: int, b: int,
                     mix_rows: bool = True, *, dense: torch.Tensor | None = None,
                     work: torch.Tensor | None = None) -> torch.Tensor:
    """One group's aggregate, spatial: (N, a, b) from idx, val (N, m), the peers' k slots
    side by side, peer after peer (m = n_peers * k).

    Each coefficient is weighted by 1 / (number of peers that sent it), which makes the sum
    the scatter-mean G; an empty slot (value 0) adds nothing and is not counted, so a peer
    whose block was all zero leaves the others' mean alone. The inverse DCT then runs as
    dense matmuls or, when a block holds fewer than a + b coefficients, as rank-m products.
    """
    n_blocks = idx.shape[0]
    weight = val
    sparse = idx.shape[1] < a + b
    # One (N, a*b) buffer: the senders' count, then (zeroed again) the dense coefficients;
    # then the result (the inverse DCT's second product overwrites it). `dense` and `work`
    # ((N, a, b) each, contiguous), where given, are used instead of new tensors.
    spare = dense  # the caller's buffer: the rank-m product's output when nothing is counted
    if n_peers > 1 or not sparse:
        if dense is None:
            dense = torch.zeros(n_blocks, a * b, dtype=val.dtype, device=val.device)
        else:
            dense = dense.view(n_blocks, a * b).zero_()
        spare = dense
    if n_peers > 1:
        assert dense is not None
        dense.scatter_add_(1, idx, (val != 0).to(val.dtype))
        # An empty slot's coefficient may have no sender at all: 0 / 1, never 0 / 0.
        weight = val / torch.gather(dense, 1, idx).clamp_min(1)
        if not sparse:
            # Only the counted places are nonzero: zero them, not the whole buffer again.
            dense.scatter_(1, idx, 0.0)
    if sparse:
        return sparse_idct_blocks(idx, weight, a, b, mix_rows,
                                  out=None if spare is None else spare.view(n_blocks, a, b),
                                  work=work)
    assert dense is not None
    dense.scatter_add_(1, idx, weight)
    coefficients = dense.view(n_blocks, a, b)
    if not mix_rows:  # one product, which cannot write over its own input
        return idct_blocks(coefficients, mix_rows, out=work)
    return idct_blocks(coefficients, mix_rows, out=None if work is None else coefficients,
                       work=work)


def decompress_blocks(
    peer_results: Sequence[Sequence[SparseResult]],
    layout: BlockLayout,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[torch.Tensor]:
    """Aggregate any number of peers' results into spatial group buffers (aggregate_blocks
    of every group)."""
    if not peer_results:
        raise ValueError("decompress needs at least one result")
    out = []
    for group, (a, b) in enumerate(layout.shapes):
        members = [i for i, (g, _) in enumerate(layout.slots) if g == group]
        idx = torch.cat([torch.cat([r[i].idx for i in members]) for r in peer_results], dim=1)
        val = torch.cat([torch.cat([r[i].val for i in members]) for r in peer_results], dim=1)
        out.append(aggregate_blocks(idx.to(device), val.to(device=device, dtype=dtype),
                                    len(peer_results), a, b, layout.group_mix_rows[group]))
    return out


def compress(tensors: Sequence[torch.Tensor], plans: Sequence[BlockPlan]) -> list[SparseResult]:
    """compress_blocks for parameter-shaped tensors."""
    layout = BlockLayout(plans)
    return compress_blocks(layout.gather(tensors), layout)


def decompress(
    peer_results: Sequence[Sequence[SparseResult]],
    plans: Sequence[BlockPlan],
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[torch.Tensor]:
    """decompress_blocks, returned as parameter-shaped tensors."""
    layout = BlockLayout(plans)
    return layout.scatter(decompress_blocks(peer_results, layout, dtype, device))
