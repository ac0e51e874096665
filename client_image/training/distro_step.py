"""One DisTrO step: the update every trainer drives (the client's DistroTrainer, its
sharded FSDP2/TP twin, the torch.optim DisTrO), over a view of the parameters.

For parameters theta_i, gradients g_i and momentum delta_i (fp32, shaped and placed like
theta_i), the step's parts (distro.py has the transforms: C = top-k of the blockwise DCT,
D = scatter-mean of the peers' coefficients and the inverse DCT):

    lookahead        theta -= lr' * sign(delta)                (undone exactly, restore())
    error feedback   delta -= D(own last result)               (its unquantized values)
    weight decay     theta *= 1 - lr * weight_decay
    momentum         delta  = decay * delta + lr * g
    compress         result = C(delta)                          -> the wire bytes (distro_wire.py)
    apply            theta -= lr * sign(D(peers' results))

The trainers decide when each part runs (trainer.py: pipelined over rounds; the
optimizer: at once); this module is the only place that computes them, so every client,
layout and wrapper runs the same operations on the same numbers.

Grouping. The parameters are cut into chunks: consecutive parameters of at most
max(STEP_CHUNK_ELEMENTS, the largest parameter) elements (a pure function of the plans,
the same on every client). Inside a chunk, every parameter's blocks of one block shape
are stacked into one (N, a, b) tensor, and each group runs one DCT (two matmuls), one
top-k, one scatter and one inverse DCT. Work on every parameter at once (the copy of its
blocks into the stacks, the elementwise updates) is one torch._foreach_* call. So the
operators a step dispatches grow with the model's bytes over the chunk (a handful of
chunks), not with its number of tensors; the chunk bounds the scratch memory of the
stacks and of the decode (a few chunk-sized tensors).

View. A ParameterView says how the tensors a process holds relate to the whole
parameters: WholeParameters for one device (they are the whole parameters); the sharded
trainer's view (sharded.py) gathers a DTensor's full value for compress and keeps this
rank's part of a decoded update. Elementwise work runs on what the process holds.

No host synchronization in the step: nothing reads a device value back, except the one
copy of the payload's slots that the wire encoding needs (start_payload_copy: from pinned
memory, on a side stream, waited for only when the bytes are encoded, so that the work
queued after it, the next forward, overlaps it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Protocol

import numpy as np
import torch

from client_image.formats.blocks import BlockPlan, SparseResult
from client_image.training.distro import (
    BlockLayout,
    aggregate_blocks,
    block_view,
    dct_blocks,
    topk_blocks,
)

STEP_CHUNK_ELEMENTS = 2**24  # 16 Mi coefficients (64 MiB in fp32) per chunk at most


class ResultSource(Protocol):
    """A peer's result as apply reads it (wire.DistroResult, or wire.ResultStream over its
    bytes): parameter i's coefficients."""

    def tensor(self, i: int) -> SparseResult: ...


class ParameterView(Protocol):
    """How the tensors of one process relate to the whole parameters."""

    def full(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The whole values of these parameter-like tensors."""
        ...

    def local(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The plain tensors this process holds of them (for elementwise work)."""
        ...

    def add_blocks(self, targets: Sequence[torch.Tensor], stacks: Sequence[torch.Tensor],
                   chunk: StepChunk, alpha: float) -> None:
        """targets (the chunk's parameter-like tensors) += alpha * the whole update
        held in `stacks` (the chunk's group stacks), on the part this process holds."""
        ...


class WholeParameters:
    """One device: the tensors are the whole parameters."""

    def full(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(tensors)

    def local(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(tensors)

    def add_blocks(self, targets: Sequence[torch.Tensor], stacks: Sequence[torch.Tensor],
                   chunk: StepChunk, alpha: float) -> None:
        torch._foreach_add_(chunk.block_views(targets), chunk.stack_views(stacks), alpha=alpha)


@dataclass(frozen=True)
class StepChunk:
    """Parameters first..stop-1, their blocks grouped by block shape (layout)."""

    first: int
    stop: int
    layout: BlockLayout

    @property
    def numel(self) -> int:
        return sum(plan.numel for plan in self.layout.plans)

    def members(self, group: int) -> list[int]:
        """The chunk's parameters (chunk-local indices) with blocks in `group`, in order."""
        return [i for i, (g, _) in enumerate(self.layout.slots) if g == group]

    def block_views(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each parameter-shaped tensor seen as its blocks (distro.block_view), no copy."""
        return [block_view(t, plan) for t, plan in zip(tensors, self.layout.plans, strict=True)]

    def stack_views(self, stacks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each parameter's blocks inside the group stacks, shaped as block_views."""
        return [self.layout.view(stacks, i) for i in range(len(self.layout.plans))]


def plan_chunks(plans: Sequence[BlockPlan],
                max_elements: int = STEP_CHUNK_ELEMENTS) -> list[StepChunk]:
    """Consecutive parameters of at most max(max_elements, largest parameter) elements."""
    if not plans:
        return []
    budget = max(max_elements, *(plan.numel for plan in plans))
    chunks, first, size = [], 0, 0
    for i, plan in enumerate(plans):
        if size + plan.numel > budget:
            chunks.append(StepChunk(first, i, BlockLayout(plans[first:i])))
            first, size = i, 0
        size += plan.numel
    chunks.append(StepChunk(first, len(plans), BlockLayout(plans[first:])))
    return chunks


class Scratch:
    """Chunk-sized working buffers kept from one use to the next, by role, on the CPU.

    A step makes several chunk-sized temporaries per chunk (the stacks, the DCT's products,
    the magnitudes, the decode's dense coefficients). On the CPU each new tensor that large
    is fresh memory from the system, zeroed and page-faulted in on first touch, which
    costs more than the pass that writes it (measured on the 125 M model: sign of 134 M
    floats 0.17 s into a new tensor, 0.05 s into an existing one). Kept, they cost their
    memory: `roles` x the largest chunk, within a phase of the step (apply, error
    feedback, compress), given back at its end (release) so the forward/backward's peak
    is as before. On other devices new tensors are made as before (CUDA's caching
    allocator already reuses the memory).

    Numbers are unchanged: the same operations write into these buffers (out=)."""

    def __init__(self, device: torch.device | str) -> None:
        self.keep = torch.device(device).type == "cpu"
        self.buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def release(self) -> None:
        """Give the buffers back (the end of a phase: apply, compress), so that they do
        not add to the forward/backward's peak; the next phase makes them once again."""
        self.buffers.clear()

    def flat(self, role: str, numel: int, dtype: torch.dtype, device: torch.device
             ) -> torch.Tensor:
        """A contiguous buffer of `numel` elements; the same memory as the last call of
        the same role and dtype (its contents are not kept: every role's user writes it)."""
        if not self.keep or device.type != "cpu":
            return torch.empty(numel, dtype=dtype, device=device)
        buffer = self.buffers.get((role, dtype))
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=dtype, device=device)
            self.buffers[(role, dtype)] = buffer
        return buffer[:numel]

    def stacks(self, role: str, layout: BlockLayout, dtype: torch.dtype,
               device: torch.device) -> list[torch.Tensor]:
        """One (N, a, b) tensor per group of `layout`, side by side in one buffer."""
        sizes = [n * a * b for n, (a, b) in zip(layout.group_sizes, layout.shapes, strict=True)]
        flat = self.flat(role, sum(sizes), dtype, device)
        out, offset = [], 0
        for size, n, (a, b) in zip(sizes, layout.group_sizes, layout.shapes, strict=True):
            out.append(flat[offset:offset + size].view(n, a, b))
            offset += size
        return out


def stack_blocks(tensors: Sequence[torch.Tensor], chunk: StepChunk,
                 scratch: Scratch | None = None) -> list[torch.Tensor]:
    """The chunk's whole parameter-shaped tensors -> one (N, a, b) stack per group (in
    `scratch`'s "stack" buffer where given)."""
    like = tensors[0]
    if scratch is not None:
        stacks = scratch.stacks("stack", chunk.layout, like.dtype, like.device)
    else:
        stacks = [torch.empty(n, a, b, dtype=like.dtype, device=like.device)
                  for n, (a, b) in zip(chunk.layout.group_sizes, chunk.layout.shapes,
                                       strict=True)]
    torch._foreach_copy_(chunk.stack_views(stacks), chunk.block_views(tensors))
    return stacks


def unstack_blocks(stacks: Sequence[torch.Tensor], chunk: StepChunk) -> list[torch.Tensor]:
    """Inverse of stack_blocks: parameter-shaped tensors (views of one new buffer)."""
    flat = torch.empty(chunk.numel, dtype=stacks[0].dtype, device=stacks[0].device)
    out, offset = [], 0
    for plan in chunk.layout.plans:
        out.append(flat[offset:offset + plan.numel].view(plan.shape))
        offset += plan.numel
    torch._foreach_copy_(chunk.block_views(out), chunk.stack_views(stacks))
    return out


@dataclass
class CompressedChunk:
    """One chunk's result, per group: idx (N, k) int64 and val (N, k) (unquantized)."""

    idx: list[torch.Tensor]
    val: list[torch.Tensor]


TopK = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@cache
def compiled_topk() -> TopK:
    """distro.topk_blocks through torch.compile (DistroStep(compile_kernels=True)): off by
    default until a GPU measurement shows it helps. Only the selection is compiled, whose
    operations are exact (abs, top-k, gather, sort), so it gives the eager bytes
    (tests/training/test_distro_compile.py); the DCT's matmuls stay eager, since inductor
    turns a product with a dimension of 1 (a vector's (64, 1) blocks) into a reduction of
    another summation order (measured: values 1 ulp apart)."""
    compiled: TopK = torch.compile(topk_blocks, dynamic=True)
    return compiled


def compress_chunk(tensors: Sequence[torch.Tensor], chunk: StepChunk,
                   topk: TopK = topk_blocks, scratch: Scratch | None = None
                   ) -> CompressedChunk:
    """C(delta) of one chunk's whole tensors: E = F_a^T X F_b per block, then per block the
    k nonzero coefficients of largest |E| (`topk`: distro.topk_blocks or its compiled copy).

    With `scratch`, two chunk-sized buffers hold the work: the stacks X, then F_a^T X in
    "work", E written over X, |E| over F_a^T X."""
    layout = chunk.layout
    stacks = stack_blocks(tensors, chunk, scratch)
    works = (scratch.stacks("work", layout, stacks[0].dtype, stacks[0].device)
             if scratch is not None else [None] * len(stacks))
    picked = []
    for stack, work, k, mix_rows in zip(stacks, works, layout.group_topk,
                                        layout.group_mix_rows, strict=True):
        if work is None:
            picked.append(topk(dct_blocks(stack, mix_rows), k))
            continue
        # Without row mixing the one product cannot write over its input: E goes to work.
        coefficients = (dct_blocks(stack, mix_rows, out=stack, work=work) if mix_rows
                        else dct_blocks(stack, mix_rows, out=work))
        magnitude = work if mix_rows else stack
        picked.append(topk_blocks(coefficients, k, magnitude) if topk is topk_blocks
                      else topk(coefficients, k))
    return CompressedChunk([idx for idx, _ in picked], [val for _, val in picked])


def per_parameter(compressed: Sequence[CompressedChunk], chunks: Sequence[StepChunk]
                  ) -> list[SparseResult]:
    """The result parameter by parameter (views into the group tensors)."""
    out = []
    for part, chunk in zip(compressed, chunks, strict=True):
        for plan, (group, first) in zip(chunk.layout.plans, chunk.layout.slots, strict=True):
            rows = slice(first, first + plan.n_blocks)
            out.append(SparseResult(part.idx[group][rows], part.val[group][rows]))
    return out


def decode_chunk(sources: Sequence[ResultSource], chunk: StepChunk,
                 device: torch.device | str, dtype: torch.dtype,
                 scratch: Scratch | None = None) -> list[torch.Tensor]:
    """D(results) of one chunk: the spatial group stacks of the peers' aggregate.

    Per group, the peers' slots side by side (idx, val (N, P * k), peer after peer along a
    row), filled by one copy per array (torch._foreach_copy_ of every peer's parameters
    into their rows of one buffer: no concatenation and no transposed copy of it), then
    aggregate_blocks. With `scratch`, the stacks returned are its "decode" buffer (or,
    for token rows, "work"): valid until the next use of the scratch."""
    # Each source's tensors of the chunk, read in parameter order (a ResultStream reads
    # forward); only this chunk's coefficients are in memory.
    read = [[source.tensor(i) for i in range(chunk.first, chunk.stop)] for source in sources]
    layout, n_peers = chunk.layout, len(sources)
    target = torch.device(device)
    denses: list[torch.Tensor | None] = [None] * len(layout.shapes)
    works: list[torch.Tensor | None] = [None] * len(layout.shapes)
    if scratch is not None:
        denses = list(scratch.stacks("decode", layout, dtype, target))
        works = list(scratch.stacks("work", layout, dtype, target))
    out = []
    for group, ((a, b), n_blocks) in enumerate(zip(layout.shapes, layout.group_sizes,
                                                    strict=True)):
        members = chunk.members(group)
        first_idx = read[0][members[0]].idx
        k = first_idx.shape[1]
        # Filled where the sources are (the host for wire payloads), then moved at once.
        # (Scratch: aggregate_blocks has read them before the next group refills them.)
        if scratch is not None:
            idx = scratch.flat("peer_idx", n_blocks * n_peers * k, torch.int64,
                               first_idx.device).view(n_blocks, n_peers, k)
            val = scratch.flat("peer_val", n_blocks * n_peers * k, dtype,
                               first_idx.device).view(n_blocks, n_peers, k)
        else:
            idx = torch.empty(n_blocks, n_peers, k, dtype=torch.int64, device=first_idx.device)
            val = torch.empty(n_blocks, n_peers, k, dtype=dtype, device=first_idx.device)
        rows = [slice(layout.slots[i][1], layout.slots[i][1] + layout.plans[i].n_blocks)
                for i in members]
        torch._foreach_copy_([idx[r, peer] for peer in range(n_peers) for r in rows],
                             [tensors[i].idx for tensors in read for i in members])
        torch._foreach_copy_([val[r, peer] for peer in range(n_peers) for r in rows],
                             [tensors[i].val for tensors in read for i in members])
        out.append(aggregate_blocks(idx.view(n_blocks, -1).to(device),
                                    val.view(n_blocks, -1).to(device), n_peers, a, b,
                                    layout.group_mix_rows[group], dense=denses[group],
                                    work=works[group]))
    return out


class _OwnResult:
    """This process's last result read as a ResultSource (for error feedback)."""

    def __init__(self, compressed: Sequence[CompressedChunk], chunks: Sequence[StepChunk]
                 ) -> None:
        self.tensors = per_parameter(compressed, chunks)

    def tensor(self, i: int) -> SparseResult:
        return self.tensors[i]


class DistroStep:
    """DisTrO's state (delta, the last own result) and the step's parts, over `view`.

    `params` are what the process holds (whole tensors, or DTensors for the sharded view);
    delta is created like them, in `buffer_dtype`."""

    def __init__(self, params: Sequence[torch.Tensor], plans: Sequence[BlockPlan],
                 view: ParameterView, *, buffer_dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None,
                 compile_kernels: bool = False) -> None:
        self.params = list(params)
        # torch.compile of the top-k selection per group: off by default, until measured
        # on a GPU.
        self.topk: TopK = compiled_topk() if compile_kernels else topk_blocks
        self.plans = list(plans)
        self.view = view
        self.chunks = plan_chunks(self.plans, STEP_CHUNK_ELEMENTS)
        self.delta = [torch.zeros_like(p, dtype=buffer_dtype) for p in self.params]
        self.device = device if device is not None else self.view.local(self.params[:1])[0].device
        self.sent: list[CompressedChunk] | None = None
        self.scratch = Scratch(self.device)
        # lookahead_swapped's weights, kept on the CPU (Scratch); the parameters point at
        # them only between lookahead_swapped and restore_swapped.
        self.looked: list[torch.Tensor] | None = None

    def reset(self) -> None:
        """delta = 0 and no pending error feedback."""
        torch._foreach_zero_(self.view.local(self.delta))
        self.sent = None

    def save_weights(self) -> list[torch.Tensor]:
        """A copy of the weights this process holds (to undo a lookahead exactly)."""
        local = self.view.local(self.params)
        saved = [torch.empty_like(t) for t in local]
        torch._foreach_copy_(saved, local)
        return saved

    def restore_weights(self, saved: Sequence[torch.Tensor]) -> None:
        torch._foreach_copy_(self.view.local(self.params), list(saved))

    def lookahead(self, lr: float) -> None:
        """theta -= lr * sign(delta)."""
        local = self.view.local(self.delta)
        torch._foreach_add_(self.view.local(self.params), torch._foreach_sign(local), alpha=-lr)

    def can_swap_lookahead(self) -> bool:
        """Whether lookahead_swapped applies: plain tensors of delta's dtype and device."""
        return (isinstance(self.view, WholeParameters)
                and all(isinstance(p, torch.nn.Parameter) and p.dtype == d.dtype
                        and p.device == d.device for p, d in zip(self.params, self.delta,
                                                                 strict=True)))

    def lookahead_swapped(self, lr: float) -> list[torch.Tensor]:
        """The lookahead without a saved copy: theta' = (-lr * sign(delta)) + theta is
        computed into sign's own buffer and the parameters are pointed at it (param.data);
        the returned originals, never touched, undo it exactly (restore_swapped). The same
        numbers as save_weights + lookahead: -lr * sign(delta) is exact (sign is -1, 0 or 1)
        and one rounded addition either way; two passes over the weights' size instead of
        four (the sign, the add), or on the CPU four passes into kept buffers (no new
        memory, which costs more there). Only where can_swap_lookahead()."""
        if self.looked is not None and any(p.data.data_ptr() == kept.data_ptr()
                                           for p, kept in zip(self.params, self.looked,
                                                              strict=True)):
            self.looked = None  # never restored (an exception in between): not reused
        if self.scratch.keep:
            # On the CPU into buffers kept from the last step (Scratch: new memory costs
            # more than a pass): (-lr * sign(delta)) + theta, the same numbers, since the
            # product is exact and one rounded addition is the same either way round.
            if self.looked is None:
                self.looked = [torch.empty_like(p) for p in self.params]
            looked = self.looked
            torch._foreach_copy_(looked, self.delta)
            torch._foreach_sign_(looked)
            torch._foreach_mul_(looked, -lr)
            torch._foreach_add_(looked, [p.data for p in self.params])
        else:
            # theta + (-lr) * sign(delta) in one pass over the sign: the product is exact,
            # so add's alpha (a fused multiply-add or not) rounds once, as mul_ then add_ did.
            looked = list(torch._foreach_add(self.params, torch._foreach_sign(self.delta),
                                             alpha=-lr))
        originals = [p.data for p in self.params]
        for param, value in zip(self.params, looked, strict=True):
            param.data = value
        return originals

    def restore_swapped(self, originals: Sequence[torch.Tensor]) -> None:
        """Undo lookahead_swapped: the parameters point at their original values again."""
        for param, value in zip(self.params, originals, strict=True):
            param.data = value

    def decay_weights(self, lr: float, weight_decay: float | None) -> None:
        """theta *= 1 - lr * weight_decay."""
        if weight_decay:
            torch._foreach_mul_(self.view.local(self.params), 1 - lr * weight_decay)

    def error_feedback(self) -> None:
        """delta -= D(own last result): what was sent leaves the buffer."""
        if self.sent is None:
            return
        own = [_OwnResult(self.sent, self.chunks)]
        dtype = self.delta[0].dtype
        for chunk in self.chunks:
            stacks = decode_chunk(own, chunk, self.device, dtype, self.scratch)
            self.view.add_blocks(self.delta[chunk.first:chunk.stop], stacks, chunk, alpha=-1.0)
        self.scratch.release()

    def momentum(self, grads: Sequence[torch.Tensor | None], lr: float, decay: float) -> None:
        """delta = decay * delta + lr * g (a missing gradient counts as zero). A gradient
        of another dtype is added as it is (the sum rounds once, in delta's dtype)."""
        torch._foreach_mul_(self.view.local(self.delta), decay)
        pairs = [(d, g) for d, g in zip(self.delta, grads, strict=True) if g is not None]
        if pairs:
            torch._foreach_add_(self.view.local([d for d, _ in pairs]),
                                self.view.local([g for _, g in pairs]), alpha=lr)

    def compress(self) -> list[CompressedChunk]:
        """C(delta), kept as the next error feedback's own result."""
        self.sent = [compress_chunk(self.view.full(self.delta[c.first:c.stop]), c,
                                    self.topk, self.scratch) for c in self.chunks]
        self.scratch.release()
        return self.sent

    def apply(self, sources: Sequence[ResultSource], lr: float) -> None:
        """theta -= lr * sign(D(results)), chunk by chunk (sources in an order every client
        agrees on)."""
        for chunk in self.chunks:
            stacks = decode_chunk(sources, chunk, self.device, torch.float32, self.scratch)
            torch._foreach_sign_(stacks)
            self.view.add_blocks(self.params[chunk.first:chunk.stop], stacks, chunk, alpha=-lr)
        self.scratch.release()


@dataclass
class SentRecord:
    """One step's compression as a verifier's shadow keeps it (DistroStep.record): delta as
    it was compressed (whole tensors) and what the shadow itself kept of it."""

    delta: list[torch.Tensor]
    sent: list[CompressedChunk]


def coefficients_at(step: DistroStep, tensors: Sequence[torch.Tensor],
                    results: Sequence[SparseResult]) -> list[CompressedChunk]:
    """C(tensors) kept at `results`' indices instead of at its own top-k: what a client whose
    delta is `tensors` sent when it published `results` (another machine's choice of the
    kept coefficients; the values unquantized, which the wire does not carry). Empty slots
    (val == 0) stay empty."""
    out = []
    for chunk in step.chunks:
        layout = chunk.layout
        idx_groups, val_groups = [], []
        for group, stack in enumerate(stack_blocks(tensors[chunk.first:chunk.stop], chunk)):
            n, k = stack.shape[0], layout.group_topk[group]
            idx = torch.zeros(n, k, dtype=torch.int64, device=stack.device)
            keep = torch.zeros(n, k, dtype=torch.bool, device=stack.device)
            for i in chunk.members(group):
                rows = slice(layout.slots[i][1], layout.slots[i][1] + layout.plans[i].n_blocks)
                result = results[chunk.first + i]
                idx[rows] = result.idx.to(stack.device)
                keep[rows] = result.val.to(stack.device) != 0
            coefficients = dct_blocks(stack, layout.group_mix_rows[group]).reshape(n, -1)
            idx_groups.append(idx)
            val_groups.append(torch.where(keep, coefficients.gather(1, idx), 0))
        out.append(CompressedChunk(idx_groups, val_groups))
    return out


def add_decoded_difference(step: DistroStep, plus: Sequence[CompressedChunk],
                           minus: Sequence[CompressedChunk],
                           targets: Sequence[tuple[Sequence[torch.Tensor], float]]) -> None:
    """target += alpha * (D(plus) - D(minus)) for each (target, alpha) (whole
    parameter-shaped tensors). The difference is taken first, so where the two agree it is
    exactly zero and the targets do not move at all."""
    sources = [_OwnResult(plus, step.chunks)], [_OwnResult(minus, step.chunks)]
    dtype = step.delta[0].dtype
    for chunk in step.chunks:
        stacks = torch._foreach_sub(decode_chunk(sources[0], chunk, step.device, dtype),
                                    decode_chunk(sources[1], chunk, step.device, dtype))
        for target, alpha in targets:
            step.view.add_blocks(list(target[chunk.first:chunk.stop]), stacks, chunk,
                                 alpha=alpha)


class PendingSlots:
    """The payload's slots on their way to the host (start_payload_copy); wait() gives
    them as payload_slots does.

    On CUDA the one device-to-host copy runs on a side stream into pinned memory, so the
    host is free and the work queued after it (the next forward) overlaps the copy on the
    device; wait() blocks on that copy alone. Elsewhere the slots are already on the host
    (the copy is a no-op) and wait() only cuts them per parameter."""

    def __init__(self, host: torch.Tensor, done: torch.cuda.Event | None,
                 compressed: Sequence[CompressedChunk], chunks: Sequence[StepChunk]) -> None:
        self.host = host
        self.done = done
        # Only the shapes are read at wait(); the group tensors stay referenced so that
        # their memory is not reused while the copy may still read `flat` (record_stream
        # covers flat itself).
        self.compressed = list(compressed)
        self.chunks = list(chunks)

    def ready(self) -> bool:
        """Whether wait() would return without blocking."""
        return self.done is None or bool(self.done.query())

    def wait(self) -> list[np.ndarray]:
        if self.done is not None:
            self.done.synchronize()
        return _cut_slots(self.host.numpy(), self.compressed, self.chunks)


def start_payload_copy(compressed: Sequence[CompressedChunk], chunks: Sequence[StepChunk],
                       one_bit: bool) -> PendingSlots:
    """Build every parameter's slots (one int32 tensor for the whole payload) and start
    its one copy to the host without blocking (PendingSlots)."""
    per_group = []
    for part in compressed:
        for idx, val in zip(part.idx, part.val, strict=True):
            wire_val = val if one_bit else val.to(torch.bfloat16)
            bits = (torch.signbit(wire_val) if one_bit else wire_val.view(torch.int16))
            per_group.append(torch.stack([idx.to(torch.int32), (wire_val != 0).to(torch.int32),
                                          bits.to(torch.int32)]).flatten())
    flat = torch.cat(per_group)
    if flat.device.type != "cuda":
        return PendingSlots(flat.cpu(), None, compressed, chunks)
    host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
    producer = torch.cuda.current_stream(flat.device)
    side = torch.cuda.Stream(flat.device)
    side.wait_stream(producer)  # the copy starts once the slots are computed
    with torch.cuda.stream(side):
        host.copy_(flat, non_blocking=True)
        done = torch.cuda.Event()
        done.record(side)
    flat.record_stream(side)  # its memory is not reused before the copy has read it
    return PendingSlots(host, done, compressed, chunks)


def payload_slots(compressed: Sequence[CompressedChunk], chunks: Sequence[StepChunk],
                  one_bit: bool) -> list[np.ndarray]:
    """Each parameter's slots as they go out, on the host, from ONE device-to-host copy:
    an int32 array (3, n_blocks, k) of [index, sent, value bits] (wire.encode_slots), where
    value bits are the sign bit (one_bit) or the bfloat16 bits, and sent is 0 for a slot
    whose value is zero as sent (empty, or a float32 that rounds to a bfloat16 zero).
    start_payload_copy(...).wait(): the copy waited for at once."""
    return start_payload_copy(compressed, chunks, one_bit).wait()


def _cut_slots(array: np.ndarray, compressed: Sequence[CompressedChunk],
               chunks: Sequence[StepChunk]) -> list[np.ndarray]:
    """The flat slots of start_payload_copy cut per parameter (views, no copy)."""
    out: list[np.ndarray] = []
    offset = 0
    for part, chunk in zip(compressed, chunks, strict=True):
        starts, position = [], offset
        for idx in part.idx:
            starts.append(position)
            position += 3 * idx.numel()
        for plan, (group, first) in zip(chunk.layout.plans, chunk.layout.slots, strict=True):
            k = part.idx[group].shape[1]
            rows = part.idx[group].shape[0]
            group_slots = array[starts[group]:starts[group] + 3 * rows * k].reshape(3, rows, k)
            out.append(group_slots[:, first:first + plan.n_blocks])
        offset = position
    return out
