"""A DisTrO result's shape: how a parameter is cut into blocks (BlockPlan) and the k kept
coefficients of each block (SparseResult).

Training makes them (training/distro.py plans the blocks and compresses into them), the
wire format writes and checks them (formats/distro_wire.py), and verification compares
them (verification/similarity.py): the one definition all three read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BlockPlan:
    """How one parameter is cut into DCT blocks and compressed.

    The wire format checks every payload against these numbers.
    """

    name: str
    shape: tuple[int, ...]
    rows: int  # R: second-to-last dimension (the length, for a vector)
    cols: int  # C: last dimension (1 for a vector)
    row_chunk: int  # a = c(R)
    col_chunk: int  # b = c(C)
    topk: int  # k = clamp(topk, 1, a*b)
    mix_rows: bool = True  # the DCT along rows; False: identity (token rows apart)

    @property
    def leading(self) -> int:
        return math.prod(self.shape) // (self.rows * self.cols)

    @property
    def n_blocks(self) -> int:
        return self.leading * (self.rows // self.row_chunk) * (self.cols // self.col_chunk)

    @property
    def block_numel(self) -> int:
        return self.row_chunk * self.col_chunk

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def block_shape(self) -> tuple[int, int]:
        return (self.row_chunk, self.col_chunk)


@dataclass
class SparseResult:
    """One parameter's compressed update: idx (n_blocks, k) int64, val (n_blocks, k).

    A slot with val == 0 is empty (its block had fewer than k nonzero coefficients): it
    contributes nothing to an aggregate and is not sent.
    """

    idx: torch.Tensor
    val: torch.Tensor
