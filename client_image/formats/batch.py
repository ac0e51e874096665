"""A batch as the data providers hand it to a trainer: [n, seq_len] token ids (Pretraining)
or [n, 2, seq_len] input ids and labels (Finetuning).

    batch = with_labels(inputs, labels)      # a data provider labels a Finetuning batch
    inputs, labels = split_labels(batch)     # a trainer reads it (labels None: Pretraining)

Data makes labelled batches and training reads them; this is the layout both agree on.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100
"""A label that is not in the loss (transformers' and Psyche's convention)."""


def with_labels(inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A labelled batch: [n, 2, seq_len], row i holding sample i's input ids and its labels.

    Finetuning batches travel in this one tensor, so every path a batch takes (rank
    processes, data-parallel shares, micro-batches, SparseLoCo's inner batches: all split
    along dim 0) carries the labels along; a Pretraining batch stays [n, seq_len]."""
    if inputs.shape != labels.shape or inputs.dim() != 2:
        raise ValueError(f"inputs {tuple(inputs.shape)} and labels {tuple(labels.shape)} "
                         "must both be [n, seq_len]")
    return torch.stack((inputs, labels.to(inputs.dtype)), dim=1)


def split_labels(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input ids, labels) of a batch; labels None for a Pretraining batch [n, seq_len]
    (its labels are its inputs)."""
    if batch.dim() == 3:
        return batch[:, 0], batch[:, 1]
    return batch, None
