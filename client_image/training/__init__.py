"""The training core: models, DisTrO, its wire format, checkpoints (docs/distro.md;
docs/data-and-checkpoints.md, "Checkpoints").

Public surface (typed; see each module for the equations and details):

Models (client_image.training.model)
    load_causal_lm(source, *, dtype="fp32"|"bf16", device="auto"|"cpu"|"cuda"|"mps",
                   revision=None, local_files_only=False) -> torch.nn.Module
    load_tokenizer(source, ...) ; resolve_model_dir(source, ...) -> Path ; pick_device(name)
    ModelLoadError

DisTrO (client_image.training.trainer, .distro)
    DistroTrainer(model, optimizer: DistroOptimizer, lr_schedule: LRSchedule, *,
                  micro_batch_size, cold_start_warmup_steps=0, start_step=0)
        .decode(payload: bytes) -> DistroResult        validate a peer's bytes (ResultDecodeError)
        .apply(step, results: Sequence[DistroResult]) -> bool   consensus results of step-2
        .train(step, batch [n, seq] int64, *, batch_id=(start, end), cold_start=False)
            -> TrainStepOutput(step, loss, payload: bytes, grad_norm, learning_rate=lr(step))
    with_labels(inputs, labels) -> batch [n, 2, seq]   a Finetuning batch (label -100: not
        in the loss, IGNORE_INDEX; client_image.formats.batch); split_labels(batch) -> (inputs, labels | None)
        .learning_rate(step) ; .plans: list[BlockPlan] ; .timings: Timings
    AdamWTrainer(model, optimizer: AdamWOptimizer, lr_schedule, *, micro_batch_size)
    scheduled_lr(schedule, step), cold_start_factor(step, start, n)

Wire format (client_image.formats.distro_wire; BlockPlan, SparseResult: formats.blocks)
    encode_result(tensors, plans, *, step, trainer_nonce, batch_start, batch_end, one_bit) -> bytes
    decode_result(payload, plans) -> DistroResult ; ResultDecodeError ; WIRE_VERSION

Checkpoints (client_image.training.checkpoint)
    save_checkpoint(model, checkpoint_dir, run_id, step, *, tokenizer_dir=None, keep_steps=3) -> Path
    list_checkpoints(checkpoint_dir, run_id) ; upload_checkpoint(path, repo_id, step, *, token,
    revision, api) -> str ; CheckpointError

Simulation and CLI: client_image.training.simulate (Simulation, SimulationConfig,
validation_loss), client_image.training.cli:main (psyche-train).
"""

import importlib
from typing import TYPE_CHECKING, Any

# Loaded on first use: importing the package (psyche-train --help, client_image.training.cli)
# must not load torch and transformers.
if TYPE_CHECKING:  # the real names for type checkers
    from client_image.formats.batch import split_labels, with_labels
    from client_image.formats.blocks import BlockPlan, SparseResult
    from client_image.formats.distro_wire import (
        WIRE_VERSION,
        DistroResult,
        ResultDecodeError,
        decode_result,
        encode_result,
    )
    from client_image.training.checkpoint import (
        CheckpointError,
        list_checkpoints,
        save_checkpoint,
        upload_checkpoint,
    )
    from client_image.training.distro import plan_model
    from client_image.training.lr import cold_start_factor, scheduled_lr
    from client_image.training.model import (
        ModelLoadError,
        load_causal_lm,
        load_tokenizer,
        pick_device,
        resolve_model_dir,
    )
    from client_image.training.trainer import AdamWTrainer, DistroTrainer, Timings, TrainStepOutput

_LAZY = {
    "CheckpointError": "client_image.training.checkpoint",
    "list_checkpoints": "client_image.training.checkpoint",
    "save_checkpoint": "client_image.training.checkpoint",
    "upload_checkpoint": "client_image.training.checkpoint",
    "BlockPlan": "client_image.formats.blocks",
    "SparseResult": "client_image.formats.blocks",
    "plan_model": "client_image.training.distro",
    "cold_start_factor": "client_image.training.lr",
    "scheduled_lr": "client_image.training.lr",
    "ModelLoadError": "client_image.training.model",
    "load_causal_lm": "client_image.training.model",
    "load_tokenizer": "client_image.training.model",
    "pick_device": "client_image.training.model",
    "resolve_model_dir": "client_image.training.model",
    "AdamWTrainer": "client_image.training.trainer",
    "DistroTrainer": "client_image.training.trainer",
    "Timings": "client_image.training.trainer",
    "TrainStepOutput": "client_image.training.trainer",
    "split_labels": "client_image.formats.batch",
    "with_labels": "client_image.formats.batch",
    "WIRE_VERSION": "client_image.formats.distro_wire",
    "DistroResult": "client_image.formats.distro_wire",
    "ResultDecodeError": "client_image.formats.distro_wire",
    "decode_result": "client_image.formats.distro_wire",
    "encode_result": "client_image.formats.distro_wire",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = [
    "WIRE_VERSION", "AdamWTrainer", "BlockPlan", "CheckpointError", "DistroResult",
    "DistroTrainer", "ModelLoadError", "ResultDecodeError", "SparseResult", "Timings",
    "TrainStepOutput", "cold_start_factor", "decode_result", "encode_result", "list_checkpoints",
    "load_causal_lm", "load_tokenizer", "pick_device", "plan_model", "resolve_model_dir",
    "save_checkpoint", "scheduled_lr", "split_labels", "upload_checkpoint", "with_labels",
]
