"""``psyche-client plan``: will this run fit on these devices, before anything starts.

    psyche-client plan --state state.toml [--model-config config.json] [--gpus N]
        [--gpu-memory-gib G] [--data-parallelism D] [--tensor-parallelism T]
        [--micro-batch-size M] [--dtype auto|bf16|fp32] [--activation-checkpointing]

The model the state file starts from (a local directory, or a hub repo whose config.json
is read from the HF cache or the hub) or `--model-config` is built on the meta device (no
weights: training/model_shape.py), training/memory_plan.py's formulas give the bytes per
device of every term, the total, and the largest micro-batch that fits, and `format_plan`
prints them as a table. The device memory is `--gpu-memory-gib`, else the local GPU's;
`--gpus` without either is an error, and with neither the plan is printed without a
verdict. Exit codes: 0 fits (or no verdict), 1 does not fit, 2 bad input (one `error:`
line on stderr).

`check_fits_or_exit` is the same check for `train` at start, against this host's free
device memory (CUDA) or available RAM (CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    import torch

    from client_image.training.memory_plan import MemoryPlan
    from client_image.training.model_shape import ModelShape
    from coordinator.config import StateFile


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=code)


def _load_state(path: Path) -> StateFile:
    from coordinator.config import ConfigError, load_state_file

    try:
        return load_state_file(path)
    except ConfigError as exc:
        raise _fail("; ".join(exc.errors)) from None


def _model_shape(state: StateFile | None, state_path: Path | None,
                 model_config: Path | None) -> ModelShape:
    """The model of --model-config, else the state's checkpoint, described from the meta device."""
    from client_image.training.model_shape import (
        PlanError,
        describe_model,
        load_model_config,
        meta_model,
        state_model_source,
    )

    try:
        if model_config is not None:
            source: str | Path = model_config
            revision = None
        elif state is not None:
            source, revision = state_model_source(state, state_path)
        else:
            raise PlanError("give --state (the run's state.toml) or --model-config")
        config = load_model_config(source, revision)
        return describe_model(meta_model(config), _model_name(config, source))
    except PlanError as exc:
        raise _fail(str(exc)) from None


def _model_name(config: object, source: str | Path) -> str:
    architectures = getattr(config, "architectures", None) or [type(config).__name__]
    return f"{architectures[0]} ({source})"


def _local_gpu_bytes() -> int | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


def human_count(n: int) -> str:
    if n >= 10**9:
        return f"{n / 1e9:.2f} B"
    if n >= 10**6:
        return f"{n / 1e6:.2f} M"
    return f"{n:,}"


def format_plan(plan: MemoryPlan) -> str:
    """The plan as a table: one row per term, bytes and a human size, then the total."""
    from client_image.training.memory_plan import human_bytes

    rows = list(plan.terms())
    total_label = "total (persistent + larger peak)"
    width = max(len(label) for label, _ in [*rows, (total_label, 0)])
    share = "" if plan.dp * plan.tp == 1 else f", {human_count(plan.params_per_device)} per device"
    lines = [
        f"model   {plan.model}: {human_count(plan.n_params)} parameters "
        f"({plan.n_params:,}{share}), meta device, no weights",
        f"run     {plan.run}: seq_len {plan.seq_len}, micro-batch {plan.micro_batch_size}, "
        f"compute {plan.compute}{', activation checkpointing' if plan.activation_checkpointing else ''}",
        f"layout  D={plan.dp} x T={plan.tp} ({plan.dp * plan.tp} device"
        f"{'s' if plan.dp * plan.tp > 1 else ''} per client)",
    ]
    if plan.optimizer == "distro":
        lines.append(f"results {plan.peers} peers x {human_bytes(plan.result_wire_bytes)} "
                     f"on the wire; up to two steps held in host memory: "
                     f"{human_bytes(plan.held_results_host)}")
    lines.append("")
    lines.append(f"{'per device':<{width}}  {'bytes':>15}  {'':>10}")
    lines.extend(f"{label:<{width}}  {size:>15,}  {human_bytes(size):>10}" for label, size in rows)
    lines.append(f"{'  forward/backward peak':<{width}}  {plan.train_peak:>15,}  "
                 f"{human_bytes(plan.train_peak):>10}")
    lines.append(f"{'  optimizer-step peak':<{width}}  {plan.optimizer_peak:>15,}  "
                 f"{human_bytes(plan.optimizer_peak):>10}")
    lines.append(f"{total_label:<{width}}  {plan.total:>15,}  "
                 f"{human_bytes(plan.total):>10}")
    return "\n".join(line.rstrip() for line in lines)


def plan(
    state: Annotated[
        Path | None, typer.Option("--state", help="The run's state.toml (model, seq_len, batch, DisTrO).")
    ] = None,
    model_config: Annotated[
        Path | None,
        typer.Option("--model-config",
                     help="A transformers config.json (or its folder) instead of the state's model."),
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", min=1, help="GPUs on the host (default: D x T).")
    ] = None,
    gpu_memory_gib: Annotated[
        float | None,
        typer.Option("--gpu-memory-gib", min=0.001,
                     help="Memory of one GPU (default: the local GPU's, if any)."),
    ] = None,
    data_parallelism: Annotated[
        int | None, typer.Option("--data-parallelism", min=1,
                                 help="D (default: --gpus / T, else 1).")
    ] = None,
    tensor_parallelism: Annotated[int, typer.Option("--tensor-parallelism", min=1)] = 1,
    micro_batch_size: Annotated[int, typer.Option("--micro-batch-size", min=1)] = 1,
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto (bf16 on GPUs, else fp32) | bf16 | fp32")
    ] = "auto",
    activation_checkpointing: Annotated[
        bool, typer.Option("--activation-checkpointing/--no-activation-checkpointing")
    ] = False,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", min=1,
                                 help="Sequence length (default: the state's max_seq_len, else 2048).")
    ] = None,
    peers: Annotated[
        int | None, typer.Option("--peers", min=1,
                                 help="Results applied per step (default: the state's bound, else 16).")
    ] = None,
) -> None:
    """Bytes per device of training the run's model, and whether it fits (meta device, no weights)."""
    from client_image.training.memory_plan import (
        CUDA_RESERVE_BYTES,
        GIB,
        fits,
        human_bytes,
        max_micro_batch,
        plan_memory,
        run_settings,
    )
    from client_image.training.model_shape import PlanError

    if dtype not in ("auto", "bf16", "fp32"):
        raise _fail(f"--dtype {dtype!r}: use auto, bf16 or fp32")
    state_file = _load_state(state) if state is not None else None
    if state_file is None and model_config is None:
        raise _fail("give --state (the run's state.toml) or --model-config")
    tp = tensor_parallelism
    dp = data_parallelism or (max(1, gpus // tp) if gpus else 1)
    if gpus is not None and gpus % (dp * tp):
        raise _fail(f"--data-parallelism {dp} x --tensor-parallelism {tp} = {dp * tp} "
                    f"does not divide --gpus {gpus}")
    if gpu_memory_gib is not None:
        device_bytes: int | None = int(gpu_memory_gib * GIB)
    else:
        device_bytes = _local_gpu_bytes()
        if device_bytes is None and gpus is not None:
            raise _fail("--gpus needs --gpu-memory-gib: this host has no CUDA device to read "
                        "it from")
    on_gpu = device_bytes is not None
    compute = ("bf16" if on_gpu else "fp32") if dtype == "auto" else dtype
    shape = _model_shape(state_file, state, model_config)
    run = run_settings(state_file, seq_len=seq_len, peers=peers)
    share = run.rank_share(dp)
    micro = min(micro_batch_size, share) if share else micro_batch_size
    settings: dict[str, Any] = {"dp": dp, "tp": tp, "compute": compute,
                "activation_checkpointing": activation_checkpointing,
                "reserve_bytes": CUDA_RESERVE_BYTES if on_gpu else 0}
    try:
        memory = plan_memory(shape, run, micro_batch_size=micro, **settings)
    except PlanError as exc:
        raise _fail(str(exc)) from None
    typer.echo(format_plan(memory))
    if micro != micro_batch_size:
        typer.echo(f"(--micro-batch-size {micro_batch_size}: a rank trains at most {share} "
                   f"sequences per step, so its micro-batches hold at most {share})")
    if device_bytes is None:
        typer.echo("\nno fit verdict: give --gpu-memory-gib (and --gpus) for a GPU host")
        return
    where = f"{gpus or dp * tp} GPU(s) of {human_bytes(device_bytes)}"
    reason = fits(memory, device_bytes)
    largest = max_micro_batch(shape, run, device_bytes, **settings)
    typer.echo("")
    if reason is None:
        typer.echo(f"fits: yes, on {where} ({human_bytes(memory.total)} per device)")
    else:
        typer.echo(f"fits: NO, on {where}: {reason}")
    if largest == 0:
        typer.echo("largest micro-batch that fits: none (even 1 sequence does not)")
    else:
        tail = (f"; a rank trains at most {share} sequences per step"
                if share is not None else "")
        typer.echo(f"largest micro-batch that fits: {largest}{tail}")
    if reason is not None:
        raise typer.Exit(code=1)


def check_fits_or_exit(
    state_path_or_model: str | Path | StateFile | torch.nn.Module,
    device: str | torch.device,
    dtype: str = "auto",
    micro_batch_size: int = 1,
    data_parallelism: int = 1,
    tensor_parallelism: int = 1,
    *,
    activation_checkpointing: bool = False,
    state: StateFile | None = None,
) -> MemoryPlan:
    """The plan of this run on this host's `device`, or exit 2 with one line saying why it
    cannot fit (or why it cannot be planned).

    `state_path_or_model`: a state.toml path, a loaded StateFile, or the model itself (a
    loaded or meta nn.Module; then `state`, if given, supplies seq_len, batch and DisTrO
    settings). Memory: free CUDA memory of `device` (torch.cuda.mem_get_info), else the
    host's available RAM. Every one of the D x T ranks is assumed to have as much.
    """
    import torch

    from client_image.training.memory_plan import (
        CUDA_RESERVE_BYTES,
        available_system_memory,
        fits,
        plan_memory,
        run_settings,
    )
    from client_image.training.model_shape import PlanError, describe_model
    from client_image.training.precision import PrecisionError, resolve_compute_dtype

    try:
        target = torch.device(device)
        compute = resolve_compute_dtype(dtype, target)
        if isinstance(state_path_or_model, torch.nn.Module):
            shape = describe_model(state_path_or_model)
            run_state = state
        else:
            if isinstance(state_path_or_model, str | Path):
                state_path: Path | None = Path(state_path_or_model)
                run_state = _load_state(Path(state_path_or_model))
            else:
                state_path, run_state = None, state_path_or_model
            shape = _model_shape(run_state, state_path, None)
        run = run_settings(run_state)
        share = run.rank_share(data_parallelism)
        micro = min(micro_batch_size, share) if share else micro_batch_size
        if target.type == "cuda":
            free, _ = torch.cuda.mem_get_info(target)
            device_bytes, reserve = int(free), CUDA_RESERVE_BYTES
        else:
            device_bytes, reserve = available_system_memory(), 0
        memory = plan_memory(shape, run, dp=data_parallelism, tp=tensor_parallelism,
                             micro_batch_size=micro, compute=compute,
                             activation_checkpointing=activation_checkpointing,
                             reserve_bytes=reserve)
    except (PlanError, PrecisionError, RuntimeError) as exc:
        raise _fail(f"cannot plan the run's memory: {' '.join(str(exc).split())}") from None
    reason = fits(memory, device_bytes)
    if reason is not None:
        raise _fail(f"this run does not fit on {target}: {reason}")
    return memory


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
