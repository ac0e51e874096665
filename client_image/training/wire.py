"""The wire format of one DisTrO result (what a trainer publishes for one step).

Version 1, all integers little-endian:

    header   "PSDR" | version u8 = 1 | flags u8 (bit 0: one-bit values; others 0)
             | step u32 | trainer_nonce u32 | batch_start u64 | batch_end u64
             | n_tensors varint
    tensor   n_blocks varint | block_numel varint | k varint
             | indices: n_blocks*k indices of w = ceil(log2(block_numel)) bits each (w >= 1),
               packed LSB-first, zero-padded to a byte
             | values: one-bit: n_blocks*k sign bits (1 = negative), LSB-first, zero-padded;
                       otherwise n_blocks*k bfloat16

Tensors follow the model's parameter order; the shapes are not sent because both sides
derive them from the model and the run config (BlockPlan). Compared with Psyche's postcard
`SerializedDistroResult` (u16 indices, ~20-40 header bytes per tensor), a 64x64 block with
k = 8 and one-bit values costs 8*(12+1) = 104 bits instead of 136, and a tensor header is
3-5 bytes.

Decoding trusts nothing: every count must match the BlockPlan, every index must be inside
its block and strictly increasing within it (no duplicates), every value finite, and no
byte may be missing or left over. Anything else raises ResultDecodeError naming the
problem, before a single tensor reaches the caller.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from client_image.training.distro import BlockPlan, SparseResult

MAGIC = b"PSDR"
WIRE_VERSION = 1
FLAG_ONE_BIT = 0x01
_FIXED = struct.Struct("<4sBBIIQQ")  # magic, version, flags, step, nonce, batch start, end
_MAX_VARINT_BYTES = 10


class ResultDecodeError(ValueError):
    """A peer's payload is not a valid result for this model; nothing was applied."""


@dataclass
class DistroResult:
    """One trainer's result for one step, decoded and validated."""

    step: int
    trainer_nonce: int
    batch_start: int
    batch_end: int
    one_bit: bool
    tensors: list[SparseResult]  # val is +-1 (float32) when one_bit, else bfloat16


def index_bits(block_numel: int) -> int:
    """w: bits needed for an index into a block of block_numel coefficients (at least 1)."""
    return max(1, math.ceil(math.log2(block_numel)))


def encode_result(
    tensors: Sequence[SparseResult],
    plans: Sequence[BlockPlan],
    *,
    step: int,
    trainer_nonce: int,
    batch_start: int,
    batch_end: int,
    one_bit: bool,
) -> bytes:
    """Serialize a result; `tensors` hold the unquantized values (quantized here if one_bit)."""
    if len(tensors) != len(plans):
        raise ValueError(f"{len(tensors)} tensors for {len(plans)} parameters")
    out = bytearray(
        _FIXED.pack(
            MAGIC, WIRE_VERSION, FLAG_ONE_BIT if one_bit else 0,
            step, trainer_nonce, batch_start, batch_end,
        )
    )
    out += _varint(len(tensors))
    for sparse, plan in zip(tensors, plans, strict=True):
        if tuple(sparse.idx.shape) != (plan.n_blocks, plan.topk):
            raise ValueError(f"{plan.name}: idx shape {tuple(sparse.idx.shape)} does not fit {plan}")
        out += _varint(plan.n_blocks) + _varint(plan.block_numel) + _varint(plan.topk)
        idx = sparse.idx.detach().cpu().numpy().astype(np.uint64).reshape(-1)
        out += _pack_uints(idx, index_bits(plan.block_numel))
        val = sparse.val.detach().cpu()
        if one_bit:
            negative = (val < 0).numpy().reshape(-1).astype(np.uint8)
            out += np.packbits(negative, bitorder="little").tobytes()
        else:
            as_int16 = val.to(torch.bfloat16).reshape(-1).view(torch.int16).numpy()
            out += as_int16.astype("<i2").tobytes()
    return bytes(out)


def decode_result(payload: bytes, plans: Sequence[BlockPlan]) -> DistroResult:
    """Parse and validate a peer's payload against the model's BlockPlans."""
    reader = _Reader(payload)
    magic, version, flags, step, nonce, start, end = _FIXED.unpack(reader.take(_FIXED.size, "header"))
    if magic != MAGIC:
        raise ResultDecodeError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != WIRE_VERSION:
        raise ResultDecodeError(f"unsupported wire version {version}, expected {WIRE_VERSION}")
    if flags & ~FLAG_ONE_BIT:
        raise ResultDecodeError(f"unknown flags 0x{flags:02x}")
    if start > end:
        raise ResultDecodeError(f"batch id start {start} > end {end}")
    one_bit = bool(flags & FLAG_ONE_BIT)
    n_tensors = reader.varint("tensor count")
    if n_tensors != len(plans):
        raise ResultDecodeError(f"{n_tensors} tensors, the model has {len(plans)} parameters")
    tensors = [_decode_tensor(reader, plan, one_bit) for plan in plans]
    if reader.remaining:
        raise ResultDecodeError(f"{reader.remaining} trailing bytes after the last tensor")
    return DistroResult(step, nonce, start, end, one_bit, tensors)


def _decode_tensor(reader: _Reader, plan: BlockPlan, one_bit: bool) -> SparseResult:
    where = f"tensor {plan.name!r}"
    n_blocks = reader.varint(f"{where} block count")
    block_numel = reader.varint(f"{where} block size")
    k = reader.varint(f"{where} k")
    expected = (plan.n_blocks, plan.block_numel, plan.topk)
    if (n_blocks, block_numel, k) != expected:
        raise ResultDecodeError(
            f"{where}: (blocks, block size, k) = {(n_blocks, block_numel, k)}, "
            f"the model expects {expected} for shape {plan.shape}"
        )
    count = n_blocks * k
    width = index_bits(block_numel)
    raw_idx = reader.take(_packed_len(count * width), f"{where} indices")
    idx = _unpack_uints(raw_idx, width, count).reshape(n_blocks, k)
    if count and int(idx.max()) >= block_numel:
        raise ResultDecodeError(f"{where}: index {int(idx.max())} outside a block of {block_numel}")
    if k > 1 and not bool((np.diff(idx, axis=1) > 0).all()):
        raise ResultDecodeError(f"{where}: indices of a block are not strictly increasing")
    if one_bit:
        raw = reader.take(_packed_len(count), f"{where} sign bits")
        bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=count, bitorder="little")
        val = torch.from_numpy(1.0 - 2.0 * bits.astype(np.float32))
    else:
        raw = reader.take(2 * count, f"{where} values")
        val = torch.from_numpy(np.frombuffer(raw, dtype="<i2").astype(np.int16)).view(torch.bfloat16)
        if not bool(torch.isfinite(val).all()):
            raise ResultDecodeError(f"{where}: non-finite value")
    return SparseResult(torch.from_numpy(idx.astype(np.int64)), val.reshape(n_blocks, k))


class _Reader:
    def __init__(self, payload: bytes) -> None:
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise ResultDecodeError(f"payload must be bytes, got {type(payload).__name__}")
        self._data = bytes(payload)
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.remaining:
            raise ResultDecodeError(
                f"truncated: {what} needs {n} bytes at offset {self._pos}, {self.remaining} left"
            )
        chunk = self._data[self._pos : self._pos + n]
        self._pos += n
        return chunk

    def varint(self, what: str) -> int:
        value = 0
        for shift in range(0, 7 * _MAX_VARINT_BYTES, 7):
            if not self.remaining:
                raise ResultDecodeError(f"truncated: {what} at offset {self._pos}")
            byte = self._data[self._pos]
            self._pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
        raise ResultDecodeError(f"{what}: varint longer than {_MAX_VARINT_BYTES} bytes")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _packed_len(bits: int) -> int:
    return (bits + 7) // 8


def _pack_uints(values: np.ndarray, width: int) -> bytes:
    """Each value as `width` bits, least significant first, concatenated and byte-padded."""
    shifts = np.arange(width, dtype=np.uint64)
    bits = ((values[:, None] >> shifts) & np.uint64(1)).astype(np.uint8).reshape(-1)
    return np.packbits(bits, bitorder="little").tobytes()


def _unpack_uints(raw: bytes, width: int, count: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=count * width, bitorder="little")
    weights = np.left_shift(np.uint64(1), np.arange(width, dtype=np.uint64))
    return (bits.reshape(count, width).astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
