"""Finetuning batches (formats.batch.with_labels): a label of -100 is not in the loss, the loss
is the mean over the other tokens, and every trainer takes the labelled batch."""

import pytest
import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.formats.batch import IGNORE_INDEX, split_labels, with_labels
from client_image.training.model import load_causal_lm
from client_image.training.objective import causal_lm_loss
from client_image.training.trainer import DistroTrainer
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

SEQ = 32
PROMPT = 12  # the first PROMPT tokens of every sample are the "prompt": masked


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return load_causal_lm(TINY_MODEL, device="cpu")


def _inputs() -> torch.Tensor:
    return LocalDataProvider(TRAIN_DATA, SEQ).get_samples(0, 1)


def _masked(targets: torch.Tensor) -> torch.Tensor:
    labels = targets.clone()
    labels[:, :PROMPT] = IGNORE_INDEX
    return labels


def _gradients(model: torch.nn.Module, batch: torch.Tensor,
               micro_batch_size: int = 2) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = causal_lm_loss(model, batch, micro_batch_size)
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
             for p in model.parameters()]
    return loss, grads


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_masked_target_carries_no_gradient_and_an_unmasked_one_does(model: torch.nn.Module) -> None:
    inputs = _inputs()
    base_loss, base = _gradients(model, with_labels(inputs, _masked(inputs)))

    # The would-be target of a masked (prompt) position changes: nothing changes.
    other_prompt = inputs.clone()
    other_prompt[:, 3] = (other_prompt[:, 3] + 17) % 256
    loss, grads = _gradients(model, with_labels(inputs, _masked(other_prompt)))
    assert loss == base_loss and _same(grads, base)

    # An unmasked (answer) target changes: the loss and the gradients change.
    other_answer = inputs.clone()
    other_answer[:, PROMPT + 3] = (other_answer[:, PROMPT + 3] + 17) % 256
    loss, grads = _gradients(model, with_labels(inputs, _masked(other_answer)))
    assert loss != base_loss and not _same(grads, base)


def test_the_loss_is_the_mean_over_the_unmasked_tokens(model: torch.nn.Module) -> None:
    inputs = _inputs()
    labels = _masked(inputs)
    loss, _ = _gradients(model, with_labels(inputs, labels), micro_batch_size=2)
    with torch.no_grad():
        logits = model(input_ids=inputs).logits[:, :-1].float()
    targets = labels[:, 1:]
    kept = targets != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(logits[kept], targets[kept])
    assert loss == pytest.approx(float(expected), rel=1e-5)
    # Labels equal to the inputs: the Pretraining loss.
    finetuning, _ = _gradients(model, with_labels(inputs, inputs))
    pretraining, _ = _gradients(model, inputs)
    assert finetuning == pytest.approx(pretraining, rel=1e-5)


def test_a_micro_batch_with_every_label_masked_adds_nothing(model: torch.nn.Module) -> None:
    inputs = _inputs()
    labels = torch.full_like(inputs, IGNORE_INDEX)
    loss, grads = _gradients(model, with_labels(inputs, labels))
    assert loss == 0.0 and all(not g.any() for g in grads)


def test_with_labels_refuses_mismatched_shapes_and_splits_back() -> None:
    inputs = _inputs()
    batch = with_labels(inputs, _masked(inputs))
    assert batch.shape == (2, 2, SEQ)
    back_inputs, back_labels = split_labels(batch)
    assert back_labels is not None
    assert torch.equal(back_inputs, inputs) and torch.equal(back_labels, _masked(inputs))
    assert split_labels(inputs) == (inputs, None)
    with pytest.raises(ValueError, match=r"must both be \[n, seq_len\]"):
        with_labels(inputs, inputs[:, :-1])


def test_distro_trainer_trains_on_the_labels() -> None:
    """Same weights, same inputs: masking the prompt changes the published result."""
    optimizer = DistroOptimizer(compression_decay=0.999, compression_topk=8,
                                compression_chunk=64, quantize_1bit=False)
    schedule = ConstantLR(base_lr=1e-3, warmup_init_lr=0.0, warmup_steps=0)
    inputs = _inputs()
    payloads = []
    for labels in (inputs, _masked(inputs)):
        trainer = DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"), optimizer, schedule,
                                micro_batch_size=1)
        payloads.append(trainer.train(0, with_labels(inputs, labels)).payload)
    assert payloads[0] != payloads[1]
