"""Which trainer a run's optimizer gets in this client, and what the client refuses.

    Dummy        DummyTrainer: nothing is computed (the model stays in this process
                 even when the client has several ranks)
    SparseLoCo   SparseLoCoTrainer, one rank only
    Distro       DistroTrainer on one rank; on D x T > 1 ranks the ranks build a
                 ShardedDistroTrainer (training/rank_group.py): `local_trainer` says None
    AdamW        refused: a networked run shares nothing with it
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from client_image.training import DistroTrainer
from client_image.training.dummy_trainer import DummyTrainer
from client_image.training.precision import ComputeDType, enable_activation_checkpointing
from client_image.training.sparseloco_trainer import SparseLoCoTrainer
from client_image.verification.settings import capture
from coordinator.config import DistroOptimizer, DummyOptimizer, LLMConfig, SparseLoCoOptimizer

log = logging.getLogger(__name__)

LocalTrainer = DistroTrainer | SparseLoCoTrainer | DummyTrainer


class WorkerError(RuntimeError):
    """The model cannot be loaded or trained with this run's configuration."""


@dataclass(frozen=True)
class TrainerSettings:
    """The client's side of a trainer: its flags, not the run's."""

    micro_batch_size: int
    compute: ComputeDType
    activation_checkpointing: bool = False
    dummy_training_delay_s: float = 0.0  # what a Dummy-optimizer step sleeps (Psyche's flag)
    split: bool = False  # the model is split across ranks (D x T > 1)


def local_trainer(model: torch.nn.Module, llm: LLMConfig, start_step: int,
                  settings: TrainerSettings) -> LocalTrainer | None:
    """The trainer of `model` in this process, or None when DisTrO trains it on the
    client's ranks. WorkerError for a run this client cannot train."""
    optimizer = llm.optimizer
    if isinstance(optimizer, DummyOptimizer):
        return DummyTrainer(delay_s=settings.dummy_training_delay_s)
    if settings.dummy_training_delay_s:
        log.warning("--dummy-training-delay-secs applies to runs of the Dummy optimizer "
                    "only; this run's is %s: ignored", type(optimizer).TAG)
    if isinstance(optimizer, SparseLoCoOptimizer):
        if settings.split:
            raise WorkerError("the SparseLoCo optimizer does not run on a model split "
                              "across ranks yet; run one rank per client")
        return SparseLoCoTrainer(
            model, optimizer, llm.lr_schedule, micro_batch_size=settings.micro_batch_size,
            cold_start_warmup_steps=llm.cold_start_warmup_steps, start_step=start_step,
            compute=settings.compute)
    if not isinstance(optimizer, DistroOptimizer):
        raise WorkerError("a networked run needs the Distro or SparseLoCo optimizer "
                          "(AdamW shares nothing)")
    if settings.split:
        return None
    if settings.activation_checkpointing:
        enable_activation_checkpointing(model)
    # Declared in every result's header, for followers to replay in (verification/).
    device = next(model.parameters()).device
    return DistroTrainer(
        model, optimizer, llm.lr_schedule, micro_batch_size=settings.micro_batch_size,
        cold_start_warmup_steps=llm.cold_start_warmup_steps, start_step=start_step,
        compute=settings.compute,
        declared=capture(settings.compute, settings.micro_batch_size, device))
