"""How far apart two DisTrO results of one model are: Psyche's three distances
(`shared/core/src/similarity.rs`), taken where they mean something for a sparse result.

A result holds, per parameter and per DCT block, the k kept coefficients (index, value;
a zero value is an empty slot). For results a and b:

    jaccard    mean over blocks of 1 - |I_a ∩ I_b| / |I_a ∪ I_b|      (I: kept indices;
               two empty blocks are at distance 0)
    hamming    fraction of the shared (block, index) slots whose signs differ
               (1.0 when nothing is shared: no evidence of agreement; 0 if both empty)
    manhattan  sum |A - B| / sum |B| over the dense coefficients (A, B: the kept values
               scattered into their blocks): Psyche's sum of |a - b|, made relative so
               that one threshold fits any model size; a scaled result moves it

Each is given per parameter and overall (blocks, slots and values pooled over every
parameter). Identical results are at 0 on all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from client_image.formats.blocks import SparseResult


@dataclass(frozen=True)
class Distances:
    jaccard: float
    hamming: float
    manhattan: float


@dataclass(frozen=True)
class Similarity:
    overall: Distances
    per_parameter: tuple[Distances, ...]


@dataclass
class _Counts:
    jaccard_sum: float = 0.0
    blocks: int = 0
    shared: int = 0
    disagree: int = 0
    diff: float = 0.0
    norm: float = 0.0

    def add(self, other: _Counts) -> None:
        for name in ("jaccard_sum", "blocks", "shared", "disagree", "diff", "norm"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def distances(self) -> Distances:
        return Distances(
            jaccard=self.jaccard_sum / self.blocks if self.blocks else 0.0,
            # nothing shared: no evidence of agreement, unless neither kept anything
            hamming=(self.disagree / self.shared if self.shared
                     else (0.0 if self.jaccard_sum == 0 else 1.0)),
            manhattan=self.diff / self.norm if self.norm else (0.0 if self.diff == 0 else 1.0))


def _dense(result: SparseResult, numel: int) -> torch.Tensor:
    """(n_blocks, numel) with each kept value at its index (empty slots add zero)."""
    dense = torch.zeros(result.idx.shape[0], numel, dtype=torch.float32)
    dense.scatter_add_(1, result.idx, result.val.float())
    return dense


def _counts(a: SparseResult, b: SparseResult, block_numel: int) -> _Counts:
    dense_a, dense_b = _dense(a, block_numel), _dense(b, block_numel)
    kept_a, kept_b = dense_a != 0, dense_b != 0
    inter = (kept_a & kept_b).sum(dim=1).double()
    union = (kept_a | kept_b).sum(dim=1).double()
    jaccard = torch.where(union > 0, 1 - inter / union.clamp_min(1), 0.0)
    shared = kept_a & kept_b
    disagree = shared & (torch.sign(dense_a) != torch.sign(dense_b))
    return _Counts(
        jaccard_sum=float(jaccard.sum()), blocks=int(dense_a.shape[0]),
        shared=int(shared.sum()), disagree=int(disagree.sum()),
        diff=float((dense_a - dense_b).abs().sum()), norm=float(dense_b.abs().sum()))


def similarity(a: Sequence[SparseResult], b: Sequence[SparseResult],
               block_numels: Sequence[int]) -> Similarity:
    """Distances of result `a` from result `b` (b is the reference for manhattan)."""
    if not len(a) == len(b) == len(block_numels):
        raise ValueError(f"results of {len(a)} and {len(b)} parameters for {len(block_numels)}")
    total = _Counts()
    per = []
    for ra, rb, numel in zip(a, b, block_numels, strict=True):
        counts = _counts(ra, rb, numel)
        total.add(counts)
        per.append(counts.distances())
    return Similarity(total.distances(), tuple(per))
