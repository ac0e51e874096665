"""What a trainer minimizes: the next-token loss of a batch, labelled or not.

    loss = causal_lm_loss(model, batch, micro_batch_size)   # gradients accumulated

A Pretraining batch [n, seq_len] trains on its own tokens through the model's loss; a
Finetuning batch [n, 2, seq_len] (formats/batch.py: with_labels, split_labels) carries its
labels, and a label of IGNORE_INDEX is not in the loss. Any other objective with LossFn's signature trains the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from client_image.formats.batch import IGNORE_INDEX, split_labels
from client_image.training.precision import ComputeDType, compute_context

LossFn = Callable[[torch.nn.Module, torch.Tensor, int, ComputeDType], float]
"""(model, batch, micro_batch_size, compute) -> mean loss, with its gradients accumulated
into the parameters: what a trainer calls to train on a batch (causal_lm_loss by default;
any other objective trains the same way)."""


def masked_lm_loss(model: torch.nn.Module, inputs: torch.Tensor,
                   labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy averaged over the tokens whose label is not IGNORE_INDEX
    (labels shifted inside, as transformers does); 0, with zero gradients, when every
    label of the micro-batch is ignored (a mean over nothing would be NaN)."""
    logits = model(input_ids=inputs).logits[:, :-1].float()
    targets = labels[:, 1:]
    counted = int((targets != IGNORE_INDEX).sum())
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="sum")
    return loss / max(counted, 1)


def causal_lm_loss(model: torch.nn.Module, batch: torch.Tensor, micro_batch_size: int,
                   compute: ComputeDType = "fp32", weight: float = 1.0) -> float:
    """Forward/backward over micro-batches; the fp32 gradients accumulate the mean loss
    (each micro-batch's loss is divided by their count), times `weight` (a data-parallel
    rank's share, parallel.dp_slice). `compute` bf16 runs forward and backward under
    autocast (precision.py). Returns the mean loss (unweighted).

    A labelled batch (with_labels: a Finetuning run) trains on its labels, each
    micro-batch's loss the mean over its non-ignored tokens, as Psyche's; a Pretraining
    batch on its own tokens, through the model's loss (bytes unchanged)."""
    micro_batches = torch.split(batch, micro_batch_size)
    total = 0.0
    for micro in micro_batches:
        inputs, labels = split_labels(micro)
        with compute_context(compute, micro.device):
            if labels is None:
                loss = model(input_ids=inputs, labels=inputs).loss.float()
            else:
                loss = masked_lm_loss(model, inputs, labels)
            loss = loss / len(micro_batches)
        (loss * weight if weight != 1.0 else loss).backward()
        total += float(loss.detach())
    return total
