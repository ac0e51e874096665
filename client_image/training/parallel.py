"""Several devices inside one client: a D x T device mesh, FSDP2 over D, tensor parallel
over T (torchtitan's `parallelize_llama`, in small steps).

    mesh      ("dp", "tp") of D x T ranks, one process per rank; NCCL on CUDA, gloo on CPU
    apply_tp  per decoder block: q, k, v, gate, up colwise (Shard(0) of the weight: each
              rank computes its heads / its slice of the MLP); o, down rowwise (Shard(1):
              partial sums, all-reduced to a replicated output). Embeddings, norms and
              the output head stay replicated.
    apply_fsdp
              fully_shard each decoder block, then the root, over "dp": parameters are
              sharded on dim 0, all-gathered for compute (in the compute dtype under a
              MixedPrecisionPolicy) and gradients reduce-scattered in fp32 (the mean over
              the D ranks, each of which trained 1/D of the assigned batch).

Weights stay fp32 (the master copy) whatever the layout; DisTrO works on them through
`full_tensor` / `shard_like` (training/sharded.py), so a client's result is one per full
parameter whatever D and T are (parallelism.md, "What our design takes").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from client_image.training.architecture import ArchitectureMismatch, check_tensor_parallel
from client_image.training.precision import ComputeDType


class ParallelismError(ValueError):
    """A D x T layout this model or this host cannot take."""


@dataclass(frozen=True)
class ParallelDims:
    """Psyche's `--data-parallelism D --tensor-parallelism T`."""

    dp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        if self.dp < 1 or self.tp < 1:
            raise ParallelismError(f"data and tensor parallelism must be >= 1, got {self.dp}, {self.tp}")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


# The tensor-parallel plan of one Llama-family decoder block: submodule -> style name.
LLAMA_BLOCK_TP_PLAN: dict[str, str] = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}

# How long a collective may wait: followers wait in one for the leader's next command,
# which comes at least every rank_group.PING_INTERVAL_S (a no-op when the run is idle).
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def init_process_group(rank: int, world_size: int, main_addr: str, main_port: int,
                       device_type: str, local_rank: int | None = None) -> None:
    """Join the client's process group (TCP rendezvous at the main rank's address).
    On CUDA the NCCL group carries tensors and a gloo group (rank_group.py) the commands;
    a rank uses the CUDA device of its index on its host (`local_rank`)."""
    if dist.is_initialized():
        return
    if device_type == "cuda":
        torch.cuda.set_device(rank if local_rank is None else local_rank)
    dist.init_process_group(
        backend="cuda:nccl,cpu:gloo" if device_type == "cuda" else "gloo",
        init_method=f"tcp://{main_addr}:{main_port}", rank=rank, world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT)


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh:
    """The ("dp", "tp") mesh over every rank of the process group (tp varies fastest, so
    the ranks of one tensor-parallel group are neighbours: one host, NVLink)."""
    if dist.get_world_size() != dims.world_size:
        raise ParallelismError(f"{dims.dp} x {dims.tp} ranks needed, the process group has "
                               f"{dist.get_world_size()}")
    return init_device_mesh(device_type, (dims.dp, dims.tp), mesh_dim_names=("dp", "tp"))


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks of a transformers causal LM (`model.model.layers`)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ParallelismError(f"{type(model).__name__} has no model.layers: only "
                               "Llama-family decoders can be split across devices")
    return list(layers)


def check_tp_divides(model: torch.nn.Module, tp: int) -> None:
    """Heads, key/value heads and the MLP width must split evenly over T ranks."""
    config = getattr(model, "config", None)
    sizes = {name: getattr(config, name, None) for name in
             ("num_attention_heads", "num_key_value_heads", "intermediate_size")}
    for name, size in sizes.items():
        if not isinstance(size, int) or size % tp:
            raise ParallelismError(f"tensor parallelism {tp} does not divide {name} = {size}")


def apply_tp(model: torch.nn.Module, tp_mesh: DeviceMesh) -> None:
    """Split every decoder block's attention and MLP over the "tp" ranks."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        parallelize_module,
    )

    try:  # the plan below names Llama's submodules
        check_tensor_parallel(getattr(model, "config", None), tp_mesh.size())
    except ArchitectureMismatch as exc:
        raise ParallelismError(str(exc)) from None
    check_tp_divides(model, tp_mesh.size())
    styles: dict[str, type[ParallelStyle]] = {"colwise": ColwiseParallel,
                                              "rowwise": RowwiseParallel}
    for block in decoder_blocks(model):
        plan: dict[str, ParallelStyle] = {
            name: styles[style]() for name, style in LLAMA_BLOCK_TP_PLAN.items()}
        parallelize_module(block, tp_mesh, plan)


def apply_fsdp(model: torch.nn.Module, dp_mesh: DeviceMesh, compute: ComputeDType) -> None:
    """FSDP2 over "dp": each block is one all-gather unit, the root holds the rest
    (embeddings, final norm, output head, tied or not)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if compute == "bf16" else None, reduce_dtype=torch.float32)
    for block in decoder_blocks(model):
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)


def parallelize_llama(model: torch.nn.Module, mesh: DeviceMesh,
                      compute: ComputeDType = "fp32") -> torch.nn.Module:
    """Tensor parallel first (it changes the parameters into DTensors on "tp"), then FSDP
    (which shards those again over "dp"), as torchtitan orders them."""
    if mesh["tp"].size() > 1:
        apply_tp(model, mesh["tp"])
    if mesh["dp"].size() > 1:
        apply_fsdp(model, mesh["dp"], compute)
    return model


def dp_share(batch: torch.Tensor, dp: int, index: int) -> tuple[torch.Tensor, float]:
    """Data-parallel rank `index`'s share of the assigned batch and the weight of its loss.

    The D shares are contiguous, as even as torch.tensor_split makes them (the
    tensor-parallel ranks of one share see the same rows). FSDP averages the D gradients,
    so a share of n of the B rows weighs n * D / B: the sum is the gradient of the mean
    over the whole batch even when B does not split evenly."""
    if len(batch) < dp:
        raise ParallelismError(f"a batch of {len(batch)} sequences cannot feed {dp} "
                               "data-parallel ranks")
    share = torch.tensor_split(batch, dp)[index]
    return share, len(share) * dp / len(batch)


def dp_slice(batch: torch.Tensor, mesh: DeviceMesh) -> tuple[torch.Tensor, float]:
    """dp_share for this rank of `mesh`."""
    return dp_share(batch, mesh["dp"].size(), mesh["dp"].get_local_rank())
