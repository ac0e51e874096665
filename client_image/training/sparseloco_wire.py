"""The wire format of one SparseLoCo result (one worker's compressed pseudo-gradient).

Version 1, all integers little-endian; the index sections are DisTrO's (formats/distro_wire.py):

    header   "PSSL" | version u8 = 1 | quant_bits u8 (2..8)
             | flags u8 (bit 1: short blocks; others 0)
             | step u32 | trainer_nonce u32 | batch_start u64 | batch_end u64
             | n_tensors varint
    tensor   n_blocks varint | block_numel varint | k varint
             | short blocks exactly as DisTrO's (wire.read_counts)
             | indices, Rice-coded gaps (below)
             | scales: one bfloat16 per block that carries a value (finite, > 0)
             | codes: sum(c) codes of quant_bits bits (sign | level << 1), packed
               LSB-first, zero-padded to a byte

Indices. Within a block the c sent indices ascend; they travel as gaps g_0 = i_0,
g_j = i_j - i_(j-1) - 1, Rice-coded with one parameter b per tensor:

    b u8 = floor(log2(floor(sum(g) / n) + 1))   (n: the tensor's sent values; 0 if none)
    remainders: n values g mod 2^b, b bits each, packed LSB-first, zero-padded
    quotients: byte length varint, then for each gap floor(g / 2^b) one-bits and a
               zero-bit, LSB-first, padded with one-bits to a byte

At density d a gap costs about log2(1/d) + 1.5 bits instead of DisTrO's fixed
ceil(log2(block size)): 9 bits rather than 12 at 1/128 in a 64 x 64 block, 6.5 rather
than 12 at 1/32. b is a function of the gaps, and decoding recomputes and requires it.

The values are the quantizer's of training/sparseloco.py: value = +-s (m + 1) / L. An
honest encoder's scale is the block's largest kept magnitude, so every block that carries
values has a code at the top level L - 1; decoding requires it, so that one set of
dequantized values has one encoding (and one hash). Decoding trusts nothing else either:
counts, indices and padding are checked as DisTrO's, and any failure raises
ResultDecodeError before a tensor reaches the caller.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import torch

from client_image.formats.blocks import BlockPlan, SparseResult
from client_image.formats.distro_wire import (
    DistroResult,
    Reader,
    ResultDecodeError,
    count_bits,
    pack_uints,
    read_counts,
    read_tensor_header,
    unpack_uints,
)
from client_image.formats.replay_settings import encode_varint
from client_image.training.sparseloco import (
    MAX_QUANT_BITS,
    MIN_QUANT_BITS,
    QuantizedBlocks,
    dequantize,
)

MAGIC = b"PSSL"
WIRE_VERSION = 1
FLAG_SHORT_BLOCKS = 0x02
_FIXED = struct.Struct("<4sBBBIIQQ")  # magic, version, bits, flags, step, nonce, start, end


def encode_sparseloco(groups: Sequence[QuantizedBlocks], plans: Sequence[BlockPlan],
                      layout_slots: Sequence[tuple[int, int]], *, quant_bits: int, step: int,
                      trainer_nonce: int, batch_start: int, batch_end: int) -> bytes:
    """Serialize the quantized groups (sparseloco.compress_error), parameter by parameter."""
    tensors = []
    for plan, (group, first) in zip(plans, layout_slots, strict=True):
        g = groups[group]
        rows = slice(first, first + plan.n_blocks)
        tensors.append(_encode_tensor(g.idx[rows], g.scale[rows], g.code[rows],
                                      g.values[rows] != 0, plan, quant_bits))
    short = [n for _, n, _ in tensors]
    flags = FLAG_SHORT_BLOCKS if any(short) else 0
    out = bytearray(_FIXED.pack(MAGIC, WIRE_VERSION, quant_bits, flags, step, trainer_nonce,
                                batch_start, batch_end))
    out += encode_varint(len(plans))
    for (counts, n_short, body), plan in zip(tensors, plans, strict=True):
        out += encode_varint(plan.n_blocks) + encode_varint(plan.block_numel)
        out += encode_varint(plan.topk)
        if flags:
            out += encode_varint(n_short)
            if n_short:
                out += pack_uints(counts.astype(np.uint64), count_bits(plan.topk))
        out += body
    return bytes(out)


def _encode_tensor(idx: torch.Tensor, scale: torch.Tensor, code: torch.Tensor,
                   sent: torch.Tensor, plan: BlockPlan, bits: int
                   ) -> tuple[np.ndarray, int, bytes]:
    sent_np = sent.cpu().numpy()
    counts = sent_np.sum(axis=1)
    body = encode_gaps(idx.cpu().numpy().astype(np.int64), sent_np)
    carried = counts > 0
    body += scale.cpu()[torch.from_numpy(carried)].view(torch.int16).numpy().astype("<i2").tobytes()
    body += pack_uints(code.cpu().numpy().astype(np.uint64)[sent_np], bits)
    return counts, int((counts < plan.topk).sum()), body


def decode_sparseloco(payload: bytes, plans: Sequence[BlockPlan],
                      quant_bits: int) -> DistroResult:
    """Parse and validate a SparseLoCo payload; values come back dequantized (float32)."""
    stream = SparseLoCoStream(payload, plans, quant_bits)
    tensors = [stream.tensor(i) for i in range(len(plans))]
    if stream.remaining:
        raise ResultDecodeError(f"{stream.remaining} trailing bytes after the last tensor")
    if stream.short_blocks and not stream.saw_short:
        raise ResultDecodeError("short-blocks flag set but every block carries k values")
    return DistroResult(stream.step, stream.trainer_nonce, stream.batch_start, stream.batch_end,
                        False, tensors)


class SparseLoCoStream:
    """A payload decoded one tensor at a time, in parameter order (as wire.ResultStream)."""

    def __init__(self, payload: bytes, plans: Sequence[BlockPlan], quant_bits: int) -> None:
        self.plans = plans
        self._reader = Reader(payload)
        magic, version, bits, flags, step, nonce, start, end = _FIXED.unpack(
            self._reader.take(_FIXED.size, "header"))
        if magic != MAGIC:
            raise ResultDecodeError(f"bad magic {magic!r}, expected {MAGIC!r} (a SparseLoCo result)")
        if version != WIRE_VERSION:
            raise ResultDecodeError(f"unsupported wire version {version}, expected {WIRE_VERSION}")
        if not MIN_QUANT_BITS <= bits <= MAX_QUANT_BITS or bits != quant_bits:
            raise ResultDecodeError(f"quant_bits {bits}, the run's is {quant_bits}")
        if flags & ~FLAG_SHORT_BLOCKS:
            raise ResultDecodeError(f"unknown flags 0x{flags:02x}")
        if start > end:
            raise ResultDecodeError(f"batch id start {start} > end {end}")
        n_tensors = self._reader.varint("tensor count")
        if n_tensors != len(plans):
            raise ResultDecodeError(f"{n_tensors} tensors, the model has {len(plans)} parameters")
        self.step, self.trainer_nonce, self.batch_start, self.batch_end = step, nonce, start, end
        self.one_bit = False
        self.bits = bits
        self.short_blocks = bool(flags & FLAG_SHORT_BLOCKS)
        self.saw_short = False
        self._starts = [self._reader.position]

    @property
    def remaining(self) -> int:
        return self._reader.remaining

    def tensor(self, i: int) -> SparseResult:
        if not 0 <= i < min(len(self._starts), len(self.plans)):
            raise IndexError(f"tensor {i}: tensors are read in order, the next new one is "
                             f"{len(self._starts) - 1} of {len(self.plans)}")
        self._reader.seek(self._starts[i])
        tensor = self._read_tensor(self.plans[i])
        if i + 1 == len(self._starts):
            self._starts.append(self._reader.position)
        return tensor

    def _read_tensor(self, plan: BlockPlan) -> SparseResult:
        reader, where = self._reader, f"tensor {plan.name!r}"
        read_tensor_header(reader, plan)
        counts, n_short = read_counts(reader, plan, self.short_blocks)
        idx, used, total = read_gaps(reader, plan, counts)
        self.saw_short |= n_short > 0
        carried = used.any(axis=1)
        n_carried = int(carried.sum())
        raw = reader.take(2 * n_carried, f"{where} scales")
        scales = torch.from_numpy(np.frombuffer(raw, dtype="<i2").astype(np.int16)).view(torch.bfloat16)
        if not bool(torch.isfinite(scales).all()) or bool((scales <= 0).any()):
            raise ResultDecodeError(f"{where}: a block scale is not finite and positive")
        codes = unpack_uints(reader.take_packed(total * self.bits, f"{where} codes"),
                             self.bits, total).astype(np.int64)
        code = np.zeros(used.shape, dtype=np.int64)
        code[used] = codes
        top = (1 << (self.bits - 1)) - 1
        at_top = ((code >> 1) == top) & used
        if not bool(at_top.any(axis=1)[carried].all()):
            raise ResultDecodeError(f"{where}: a block has no value at its scale (not canonical)")
        scale = torch.zeros(plan.n_blocks, dtype=torch.bfloat16)
        scale[torch.from_numpy(carried)] = scales
        sent = torch.from_numpy(used)
        values = dequantize(torch.from_numpy(code), scale, sent, self.bits)
        return SparseResult(torch.from_numpy(idx.astype(np.int64)), values)


def rice_parameter(gap_sum: int, n: int) -> int:
    """b = floor(log2(floor(mean gap) + 1)), in integers (0 when nothing is sent)."""
    return (gap_sum // n + 1).bit_length() - 1 if n else 0


def encode_gaps(idx: np.ndarray, sent: np.ndarray) -> bytes:
    """The index section of one tensor: Rice parameter, remainders, quotients."""
    gaps = np.concatenate([idx[:, :1], idx[:, 1:] - idx[:, :-1] - 1], axis=1)[sent]
    b = rice_parameter(int(gaps.sum()), len(gaps))
    out = bytearray([b])
    out += pack_uints((gaps & ((1 << b) - 1)).astype(np.uint64), b) if b else b""
    quotients = gaps >> b
    length = int(quotients.sum()) + len(gaps)
    bits = np.ones(_padded(length), dtype=np.uint8)
    bits[np.cumsum(quotients + 1) - 1] = 0  # each gap's terminating zero
    unary = np.packbits(bits, bitorder="little").tobytes()
    return bytes(out) + encode_varint(len(unary)) + unary


def _padded(bits: int) -> int:
    return (bits + 7) // 8 * 8


def read_gaps(reader: Reader, plan: BlockPlan, counts: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, int]:
    """(idx (n_blocks, k), used (n_blocks, k), total) from the Rice-coded index section."""
    where = f"tensor {plan.name!r}"
    total = int(counts.sum())
    b = reader.take(1, f"{where} Rice parameter")[0]
    if b > 32:
        raise ResultDecodeError(f"{where}: Rice parameter {b} > 32")
    remainders = (unpack_uints(reader.take_packed(total * b, f"{where} index remainders"), b,
                               total).astype(np.int64) if b else np.zeros(total, np.int64))
    n_bytes = reader.varint(f"{where} index quotients length")
    bits = np.unpackbits(np.frombuffer(reader.take(n_bytes, f"{where} index quotients"),
                                       dtype=np.uint8), bitorder="little")
    ends = np.flatnonzero(bits == 0)
    if len(ends) != total:
        raise ResultDecodeError(f"{where}: {len(ends)} index quotients, {total} values")
    used_bits = int(ends[-1]) + 1 if total else 0
    if n_bytes != _padded(used_bits) // 8:  # the padding is all ones (no zero after ends)
        raise ResultDecodeError(f"{where}: index quotients are not {_padded(used_bits) // 8} bytes")
    quotients = np.diff(ends, prepend=-1) - 1
    gaps = (quotients << b) | remainders
    if rice_parameter(int(gaps.sum()), total) != b:
        raise ResultDecodeError(f"{where}: Rice parameter {b} is not the gaps' (not canonical)")
    used = np.arange(plan.topk) < counts[:, None]
    steps = np.zeros(used.shape, dtype=np.int64)
    steps[used] = gaps + 1
    idx = np.cumsum(steps, axis=1) - 1
    if total and int(idx[used].max()) >= plan.block_numel:
        raise ResultDecodeError(f"{where}: an index falls outside a block of {plan.block_numel}")
    return np.where(used, idx, 0), used, total
