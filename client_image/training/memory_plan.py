"""Will it fit? Bytes per device of a client's training, from the model's shape alone.

The shape is read on the meta device (model_shape.py: shapes, no storage, an 8 B model
costs nothing), and every term below is a formula over its parameters and the run's
settings. The terms follow what this client does (precision.py, trainer.py, sharded.py,
parallel.py), not a generic trainer; N is the model's parameter count, N_dev a device's
share of it (below), p the compute dtype's bytes (bf16 2, fp32 4), s the sequence length,
b the micro-batch, D the data parallelism and T the tensor parallelism.

Sharding (parallel.py). TP splits only the decoder blocks' q, k, v, gate, up (colwise:
dim 0 of the weight) and o, down (rowwise: dim 1) over T; embeddings, norms and the
output head stay whole on every rank. FSDP2 (D > 1) then shards every parameter's dim 0
over D, padded to a multiple of D. N_dev = sum over parameters of that local size; it is
exactly N / (D x T) when every dimension divides and nothing is replicated.

Persistent (the whole step):

    parameters       4 N_dev   the master weights are fp32 whatever --dtype (precision.py:
                               every client applies the same sign step to the same fp32
                               values), so bf16 changes compute, not the stored weights
    gradients        4 N_dev   fp32: micro-batches accumulate, FSDP reduce-scatters in fp32
    DisTrO state     4 N_dev   the momentum / error-feedback `delta`, fp32 whatever the
                               compute dtype, sharded like its parameter (sharded.py)
                               (AdamW, local only: 8 N_dev for its two moments)

Forward and backward (the larger of this and the optimizer phase counts):

    lookahead copy   4 N_dev   DisTrO's train() saves the weights before the lookahead and
                               restores them after backward (an exact undo)
    compute weights            D = 1, bf16: autocast keeps one bf16 copy of every nn.Linear
                               weight for the step: 2 x (their local numel), fp32: none.
                               D > 1: FSDP all-gathers in the compute dtype the root's
                               parameters (embeddings, norm, head; not resharded after
                               forward) and two decoder blocks (the current and the
                               prefetched): p (root + 2 block), plus the unsharded gradient
                               of the largest unit in p and its fp32 cast for the
                               reduce-scatter (bf16 only): (p + 4) max(root, block)
    activations      per micro-batch, see `activation_bytes`
    logits           12 s b V  at the start of backward three fp32 s x b x V tensors live
                               at once: the log-softmax the loss keeps, the loss's gradient
                               and the log-softmax's gradient (the output head is replicated:
                               not divided by T)

Optimizer (apply, error feedback, compress; no activations alive). The DisTrO step
(distro_step.py) works one chunk of consecutive parameters at a time on every layout (a
chunk holds at most max(16 Mi elements, P_max) elements, P_max the largest parameter):
apply, error feedback and, sharded (D x T > 1), the gathered delta of compress are a
chunk's, not the model's. Per block-shape group g of
DisTrO's layout (N_g parameters, blocks a x b, m coefficients per block after
concatenating the peers' top-k), and for one parameter as a group of its own:

    decode           4 N (the aggregate) + 4 N_g (per-coefficient sender counts, when
                     more than one peer) + 4 N_g m (1/a + 1/b) (the rank-m factors) when
                     m < a + b, else 8 N_g (dense coefficients and the inverse DCT's
                     intermediate); then the signed / scattered copy: >= 8 N
    apply            the decode of the worst chunk (+ its whole update and shard, sharded)
    error feedback   the decode of the worst chunk of the own result (+ the same, sharded)
    compress         16 C_max, C_max the largest chunk (its blocks stacked, the DCT's
                     intermediate and result, |E|); sharded: 20 C_max (+ the gathered
                     delta)
    peers' results   32 bytes per kept coefficient per peer on the device during apply,
                     for one chunk at a time: int64 index and fp32 value, plus the
                     per-slot sender count and weight
    held (host)      the wire bytes of up to two steps of the peers' results (distro_wire), in
                     host memory until decoded: shown, not counted per device

    optimizer peak   the largest of decode, error feedback (decode of one result) and
                     compress, plus the peers' decoded results

total = parameters + gradients + optimizer state + max(forward/backward, optimizer) +
reserve (a GPU's CUDA context, cuBLAS workspaces and allocator slack).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from client_image.formats.distro_wire import index_bits
from client_image.formats.replay_settings import MAX_SECTION_BYTES
from client_image.training.distro import BlockLayout, plan_model
from client_image.training.distro_step import plan_chunks
from client_image.training.model_shape import (
    ModelShape,
    ParamInfo,
    PlanError,
    describe_model,
    meta_model,
    tp_problem,
)

if TYPE_CHECKING:
    from coordinator.config import LLMConfig, StateFile

ComputeDType = Literal["bf16", "fp32"]
GIB = 1 << 30
MIB = 1 << 20
# A GPU's CUDA context, cuBLAS / NCCL workspaces and the caching allocator's fragmentation:
# memory a process cannot give to tensors (the context alone is 0.5-1 GiB on an H100).
CUDA_RESERVE_BYTES = 2 * GIB
LOGIT_BYTES = 12  # per logit at the start of backward (module docstring)
PEER_SLOT_BYTES = 32  # per kept coefficient per peer on the device during apply
_WIRE_HEADER_BYTES = 30  # magic 4, version 1, flags 1, step 4, nonce 4, batch start 8, end 8
# The replay settings' length prefix and longest body (formats/replay_settings.py).
_SETTINGS_SECTION_BYTES = -(-MAX_SECTION_BYTES.bit_length() // 7) + MAX_SECTION_BYTES
# Without a state file: Psyche's consilience run (config/consilience/state.toml upstream).
DEFAULT_SEQ_LEN = 2048
DEFAULT_PEERS = 16
DEFAULT_DISTRO = (64, 4, True)  # compression_chunk, compression_topk, quantize_1bit


# ----------------------------------------------------------------- inputs


@dataclass(frozen=True)
class DistroSettings:
    chunk: int
    topk: int
    one_bit: bool


@dataclass(frozen=True)
class RunSettings:
    """The run's side of the plan (a state file's, or the defaults above)."""

    name: str
    seq_len: int
    peers: int  # results applied per step (one per trainer)
    distro: DistroSettings | None  # None: AdamW (local only, no results)
    client_batch: int | None = None  # the most sequences one client is assigned per step

    def rank_share(self, dp: int) -> int | None:
        """The most sequences one data-parallel rank trains per step (parallel.dp_slice)."""
        return None if self.client_batch is None else -(-self.client_batch // dp)


def run_settings(state: StateFile | None, *, seq_len: int | None = None,
                 peers: int | None = None) -> RunSettings:
    """A state file's sequence length, batch and optimizer; overrides win.

    Peers: one result per trainer that has a batch, so at most min(MAX_CLIENTS, the
    largest global batch); a client's batch is at most ceil(batch / min_clients).
    """
    from coordinator.config import DistroOptimizer
    from coordinator.limits import MAX_CLIENTS

    if state is None:
        chunk, topk, one_bit = DEFAULT_DISTRO
        return RunSettings("(no state file: Psyche's consilience settings)",
                           seq_len or DEFAULT_SEQ_LEN, peers or DEFAULT_PEERS,
                           DistroSettings(chunk, topk, one_bit))
    batch = state.config.global_batch_size_end
    optimizer = state.model.optimizer
    distro = (DistroSettings(optimizer.compression_chunk, optimizer.compression_topk,
                             optimizer.quantize_1bit)
              if isinstance(optimizer, DistroOptimizer) else None)
    return RunSettings(
        name=state.run_id,
        seq_len=seq_len or state.model.max_seq_len,
        peers=peers or min(MAX_CLIENTS, batch),
        distro=distro,
        client_batch=-(-batch // max(1, state.config.min_clients)),
    )


# ----------------------------------------------------------------- the plan


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device of one training step (module docstring for every rule)."""

    model: str
    run: str
    n_params: int
    params_per_device: int  # N_dev
    dp: int
    tp: int
    compute: ComputeDType
    micro_batch_size: int
    seq_len: int
    activation_checkpointing: bool
    optimizer: Literal["distro", "adamw"]
    # per device, bytes
    parameters: int
    gradients: int
    optimizer_state: int
    lookahead: int
    compute_weights: int
    activations: int
    logits: int
    peer_results: int  # decoded on the device during apply
    distro_scratch: int  # the optimizer phase's full-size fp32 temporaries
    reserve: int
    # the wire format, for information
    peers: int
    result_wire_bytes: int
    held_results_host: int  # host memory, not counted in total

    @property
    def persistent(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state

    @property
    def train_peak(self) -> int:
        return self.lookahead + self.compute_weights + self.activations + self.logits

    @property
    def optimizer_peak(self) -> int:
        return self.distro_scratch + self.peer_results

    @property
    def total(self) -> int:
        return self.persistent + max(self.train_peak, self.optimizer_peak) + self.reserve

    def terms(self) -> Iterator[tuple[str, int]]:
        """(label, bytes) of every per-device term, in the table's order."""
        state = "DisTrO state (fp32 delta)" if self.optimizer == "distro" else "AdamW moments"
        yield "parameters (fp32 master)", self.parameters
        yield "gradients (fp32)", self.gradients
        yield state, self.optimizer_state
        yield "lookahead copy", self.lookahead
        yield f"compute weights ({self.compute})", self.compute_weights
        yield f"activations ({self.micro_batch_size} x {self.seq_len})", self.activations
        yield "logits + loss (fp32)", self.logits
        yield "peers' results (decoded)", self.peer_results
        yield "DisTrO scratch (full size)", self.distro_scratch
        yield "reserve (CUDA context)", self.reserve


def _local_numel(param: ParamInfo, dp: int, tp: int) -> int:
    """Elements of `param` on one device: TP's split, then FSDP's padded dim-0 shard."""
    shape = list(param.shape) or [1]
    if tp > 1 and param.tp_style == "colwise":
        shape[0] = -(-shape[0] // tp)
    elif tp > 1 and param.tp_style == "rowwise" and len(shape) > 1:
        shape[1] = -(-shape[1] // tp)
    if dp > 1:
        shape[0] = -(-shape[0] // dp)
    return math.prod(shape)


def activation_bytes(shape: ModelShape, *, micro_batch_size: int, seq_len: int,
                     compute: ComputeDType, dp: int = 1, tp: int = 1,
                     activation_checkpointing: bool = False) -> int:
    """Activations kept for backward of one micro-batch, per device, for a Llama-family
    decoder (transformers' LlamaDecoderLayer with SDPA attention).

    The rule of thumb of Korthikanti et al. 2022 ("Reducing Activation Recomputation in
    Large Transformer Models") counts s·b·h·(34 + 5·a·s/h) bytes per layer at 16 bits for a
    GPT block, s·b·h·(10 + 24/t + 5·a·s/(h·t)) with t-way tensor parallelism. The same
    count for this client's Llama block, tensor by tensor, in bytes per token per layer:

        p · (3·q + 2·kv) / T      SDPA keeps q, k, v (GQA unexpanded: no mask in training)
                                  and its output; o_proj keeps its contiguous input
        4·p·i / T                 SwiGLU: gate and up outputs, silu(gate), their product
        n·h                       the two RMSNorms and their consumers' inputs, replicated
                                  over T: n = 24 in fp32 (input, normalized, output: 4 B
                                  each, twice); bf16 at D = 1 (fp32 master weights under
                                  autocast, so the residual stream is fp32): 26 (input and
                                  normalized in fp32, plus autocast's separate bf16 copies
                                  for q, k, v, gate and up); bf16 under FSDP (bf16 weights,
                                  bf16 residual): 16 (the fp32 upcast, the bf16 normalized
                                  and output)

    with q = heads·head_dim, kv = kv_heads·head_dim, i = the MLP width, p the compute
    dtype's bytes. No s x s attention scores: SDPA's flash / memory-efficient kernels keep
    only a per-row log-sum-exp (eager attention would add p·a·s² per layer and sequence).
    Once per token: the final norm and the head's input (12 h fp32, 10 h bf16, 8 h FSDP).

    With --activation-checkpointing each layer keeps only its input (r·h per token, r the
    residual stream's bytes: 4, or 2 under FSDP bf16) and one layer at a time is
    recomputed in backward: L·r·h + one layer + the final norm.
    """
    p = 2 if compute == "bf16" else 4
    if compute == "fp32":
        norms, final, residual = 24, 12, 4
    elif dp == 1:
        norms, final, residual = 26, 10, 4
    else:
        norms, final, residual = 16, 8, 2
    q = shape.heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    split = p * (3 * q + 2 * kv) + 4 * p * shape.intermediate
    layer = norms * shape.hidden + -(-split // tp)
    if activation_checkpointing:
        per_token = shape.layers * residual * shape.hidden + layer + final * shape.hidden
    else:
        per_token = shape.layers * layer + final * shape.hidden
    return seq_len * micro_batch_size * per_token


def result_wire_bytes(plans: list[Any], one_bit: bool) -> int:
    """Bytes of one result in the wire format (distro_wire) when every block carries k
    coefficients (a block with fewer nonzero ones carries fewer: this is the most), with
    the longest replay-settings section a trainer can declare (every current client
    declares one: verification/followers.py; a real one is shorter, about 40 bytes)."""
    total = _WIRE_HEADER_BYTES + _SETTINGS_SECTION_BYTES + _varint_len(len(plans))
    for plan in plans:
        slots = plan.n_blocks * plan.topk
        total += _varint_len(plan.n_blocks) + _varint_len(plan.block_numel) + _varint_len(plan.topk)
        total += -(-slots * index_bits(plan.block_numel) // 8)
        total += -(-slots // 8) if one_bit else 2 * slots
    return total


def _varint_len(value: int) -> int:
    return max(1, -(-value.bit_length() // 7))


def _decode_scratch(layout: BlockLayout, peers: int, n_params: int) -> int:
    """decompress_blocks' temporaries for `peers` results (module docstring, "decode")."""
    worst = 0
    for (a, b), n_blocks, k in zip(layout.shapes, layout.group_sizes, layout.group_topk,
                                   strict=True):
        group = n_blocks * a * b
        m = k * peers
        count = 4 * group if peers > 1 else 0
        factors = 4 * n_blocks * m * (a + b) if m < a + b else 8 * group
        worst = max(worst, count + factors)
    return max(4 * n_params + worst, 8 * n_params)


def plan_memory(shape: ModelShape, run: RunSettings, *, dp: int = 1, tp: int = 1,
                micro_batch_size: int = 1, compute: ComputeDType = "bf16",
                activation_checkpointing: bool = False, reserve_bytes: int = 0) -> MemoryPlan:
    """Bytes per device of training `shape` with `run`'s settings on a D x T layout."""
    if dp < 1 or tp < 1 or micro_batch_size < 1:
        raise PlanError(f"parallelism and micro-batch must be >= 1, got D={dp} T={tp} "
                        f"micro-batch {micro_batch_size}")
    if (dp > 1 or tp > 1) and not shape.has_blocks:
        raise PlanError(f"{shape.name} has no model.layers: only Llama-family decoders can "
                        "be split across devices (use D = T = 1)")
    problem = tp_problem(shape, tp)
    if problem is not None:
        raise PlanError(problem)
    n = shape.n_params
    local = [_local_numel(p, dp, tp) for p in shape.params]
    n_dev = sum(local)
    p = 2 if compute == "bf16" else 4
    if dp == 1:
        linear = sum(size for size, info in zip(local, shape.params, strict=True) if info.linear)
        compute_weights = 2 * linear if compute == "bf16" else 0
    else:
        tp_local = [_local_numel(info, 1, tp) for info in shape.params]
        root = sum(size for size, info in zip(tp_local, shape.params, strict=True)
                   if info.block is None)
        per_block: dict[int, int] = {}
        for size, info in zip(tp_local, shape.params, strict=True):
            if info.block is not None:
                per_block[info.block] = per_block.get(info.block, 0) + size
        block = max(per_block.values(), default=0)
        cast = 4 if p != 4 else 0  # the fp32 copy FSDP reduce-scatters (reduce_dtype)
        compute_weights = p * (root + 2 * block) + (p + cast) * max(root, block)
    tokens = run.seq_len * micro_batch_size
    activations = activation_bytes(shape, micro_batch_size=micro_batch_size,
                                   seq_len=run.seq_len, compute=compute, dp=dp, tp=tp,
                                   activation_checkpointing=activation_checkpointing)
    logits = LOGIT_BYTES * tokens * shape.vocab
    if run.distro is None:
        optimizer_state, lookahead, peer_results, scratch, wire = 8 * n_dev, 0, 0, 0, 0
    else:
        plans = plan_model([(info.name, info.shape) for info in shape.params],
                           run.distro.chunk, run.distro.topk)
        slots = sum(plan.n_blocks * plan.topk for plan in plans)
        wire = result_wire_bytes(plans, run.distro.one_bit)
        optimizer_state, lookahead = 4 * n_dev, 4 * n_dev
        del slots  # the device holds one chunk's results at a time (apply)
        chunks = plan_chunks(plans)
        peer_results = max(PEER_SLOT_BYTES * run.peers * sum(
            plan.n_blocks * plan.topk for plan in chunk.layout.plans) for chunk in chunks)
        shard = 0 if dp * tp == 1 else 1
        # Sharded, a chunk's decoded update is made whole, then cut into this rank's shard.
        apply = max(_decode_scratch(chunk.layout, run.peers, chunk.numel)
                    + shard * (4 * chunk.numel + 4 * chunk.numel // (dp * tp))
                    for chunk in chunks)
        feedback = max(_decode_scratch(chunk.layout, 1, chunk.numel)
                       + shard * (4 * chunk.numel + 4 * chunk.numel // (dp * tp))
                       for chunk in chunks)
        largest_chunk = max(chunk.numel for chunk in chunks)
        # The chunk's stacks, the DCT's intermediate and result, |E| (+ sharded, the
        # chunk's gathered delta).
        compress = (16 if dp * tp == 1 else 20) * largest_chunk
        # The largest of the three phases; the peers' decoded results (on the device only
        # while applying) are added to it whichever it is: a little more, never less.
        scratch = max(apply, feedback, compress)
    return MemoryPlan(
        model=shape.name, run=run.name, n_params=n, params_per_device=n_dev, dp=dp, tp=tp,
        compute=compute, micro_batch_size=micro_batch_size, seq_len=run.seq_len,
        activation_checkpointing=activation_checkpointing,
        optimizer="distro" if run.distro is not None else "adamw",
        parameters=4 * n_dev, gradients=4 * n_dev, optimizer_state=optimizer_state,
        lookahead=lookahead, compute_weights=compute_weights, activations=activations,
        logits=logits, peer_results=peer_results, distro_scratch=scratch,
        reserve=reserve_bytes, peers=run.peers if run.distro is not None else 0,
        result_wire_bytes=wire, held_results_host=2 * run.peers * wire,
    )


def fits(plan: MemoryPlan, device_bytes: int) -> str | None:
    """None when `plan` fits in `device_bytes` per device, else one line saying why not."""
    if plan.total <= device_bytes:
        return None
    biggest = sorted(plan.terms(), key=lambda term: term[1], reverse=True)[:2]
    largest = ", ".join(f"{label} {human_bytes(size)}" for label, size in biggest)
    if plan.optimizer_peak >= plan.train_peak and plan.persistent + plan.optimizer_peak \
            + plan.reserve > device_bytes:
        hint = ("DisTrO's optimizer step works on full-size fp32 tensors on every rank: "
                "more devices do not shrink it")
    elif plan.activations + plan.logits > plan.persistent:
        hint = "try a smaller --micro-batch-size or --activation-checkpointing"
    else:
        hint = "shard it over more devices (--data-parallelism / --tensor-parallelism)"
    return (f"needs {human_bytes(plan.total)} per device, the device has "
            f"{human_bytes(device_bytes)} (largest: {largest}); {hint}")


def max_micro_batch(shape: ModelShape, run: RunSettings, device_bytes: int, *,
                    limit: int = 1 << 16, **settings: Any) -> int:
    """The largest micro-batch (<= limit) whose plan fits in `device_bytes`; 0 if none.
    The plan grows with the micro-batch (activations and logits), so a binary search."""
    def ok(micro: int) -> bool:
        return fits(plan_memory(shape, run, micro_batch_size=micro, **settings),
                    device_bytes) is None

    if not ok(1):
        return 0
    low, high = 1, limit
    while low < high:
        mid = (low + high + 1) // 2
        if ok(mid):
            low = mid
        else:
            high = mid - 1
    return low


# ----------------------------------------------------------------- sizes, the host, the client


def human_bytes(size: int) -> str:
    if size >= GIB:
        return f"{size / GIB:.2f} GiB"
    if size >= MIB:
        return f"{size / MIB:.1f} MiB"
    if size >= 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size} B"


def available_system_memory() -> int:
    """Bytes of RAM available to a new allocation (psutil if installed, else /proc/meminfo)."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    raise PlanError("cannot tell how much memory this host has (no psutil, no /proc/meminfo)")


def run_refusal(config: Any, llm: LLMConfig, device_bytes: int, *, dp: int = 1, tp: int = 1,
                micro_batch_size: int = 1, compute: ComputeDType = "bf16",
                activation_checkpointing: bool = False,
                reserve_bytes: int = CUDA_RESERVE_BYTES) -> str | None:
    """Why a client cannot train the run's model (a transformers config) with `llm`'s
    settings on devices of `device_bytes` each, or None when it fits: what the client
    checks before it loads any weight onto a GPU (runtime/worker.py). The peers are
    Psyche's typical 16 (a client does not know the run's swarm before it trains)."""
    from coordinator.config import DistroOptimizer

    optimizer = llm.optimizer
    distro = (DistroSettings(optimizer.compression_chunk, optimizer.compression_topk,
                             optimizer.quantize_1bit)
              if isinstance(optimizer, DistroOptimizer) else None)
    run = RunSettings("this run", llm.max_seq_len, DEFAULT_PEERS, distro)
    try:
        plan = plan_memory(describe_model(meta_model(config)), run, dp=dp, tp=tp,
                           micro_batch_size=micro_batch_size, compute=compute,
                           activation_checkpointing=activation_checkpointing,
                           reserve_bytes=reserve_bytes)
    except PlanError as exc:
        return str(exc)
    return fits(plan, device_bytes)
