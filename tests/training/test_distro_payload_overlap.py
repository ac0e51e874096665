"""The payload's copy to the host overlapped with the next forward
(distro_step.start_payload_copy, DistroTrainer.train_async): the same bytes and weights as
waiting for it at once (DistroTrainer.train). On CPU the copy is a no-op; on CUDA it runs
on a side stream from pinned memory (the CUDA test runs where a GPU is present)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.training.distro_step import payload_slots, start_payload_copy
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

DISTRO = DistroOptimizer(
    compression_decay=0.999, compression_topk=8, compression_chunk=64, quantize_1bit=True,
    clip_grad_norm=1.0, weight_decay=0.1,
)


def _trainer(device: str, one_bit: bool = True) -> DistroTrainer:
    torch.manual_seed(0)
    model = load_causal_lm(TINY_MODEL, device=device)
    schedule = ConstantLR(base_lr=1e-3, warmup_init_lr=0.0, warmup_steps=0)
    optimizer = DISTRO.model_copy(update={"quantize_1bit": one_bit})
    return DistroTrainer(model, optimizer, schedule, micro_batch_size=2)


def _batch(step: int) -> torch.Tensor:
    return LocalDataProvider(TRAIN_DATA, 32).get_samples(2 * step, 2 * step + 1)


def _weights(trainer: DistroTrainer) -> str:
    digest = hashlib.sha256()
    for p in trainer.params:
        digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def _pipelined(device: str, overlapped: bool, one_bit: bool) -> tuple[list[bytes], str]:
    """Five pipelined steps (apply the payload of s - 2, train s). Overlapped: train_async,
    then the next forward queued before the payload is taken (result())."""
    trainer = _trainer(device, one_bit)
    payloads: list[bytes] = []
    for step in range(5):
        if step >= 2:
            trainer.apply_payloads(step, [payloads[step - 2]])
        if overlapped:
            pending = trainer.train_async(step, _batch(step), batch_id=(step, step))
            with torch.no_grad():  # the next forward, queued while the copy is under way
                trainer.model(_batch(step + 1).to(device))
            output = pending.result()
        else:
            output = trainer.train(step, _batch(step), batch_id=(step, step))
            with torch.no_grad():
                trainer.model(_batch(step + 1).to(device))
        assert output.payload is not None and output.step == step
        payloads.append(output.payload)
    return payloads, _weights(trainer)


@pytest.mark.parametrize("one_bit", [True, False])
def test_overlapped_copy_gives_the_bytes_and_weights_of_a_waited_one_on_cpu(one_bit):
    waited = _pipelined("cpu", overlapped=False, one_bit=one_bit)
    overlapped = _pipelined("cpu", overlapped=True, one_bit=one_bit)
    assert len(waited[0]) == 5
    assert overlapped[0] == waited[0]
    assert overlapped[1] == waited[1]


def test_pending_slots_are_those_of_payload_slots_and_result_is_idempotent():
    trainer = _trainer("cpu")
    trainer.train(0, _batch(0))
    pending = trainer.train_async(1, _batch(1), batch_id=(1, 1))
    assert pending.ready()  # on CPU nothing is in flight
    first = pending.result()
    assert first.payload is not None
    assert pending.result() is first and pending.result().payload == first.payload
    compressed, chunks = trainer.distro.sent, trainer.distro.chunks
    assert compressed is not None
    direct = payload_slots(compressed, chunks, one_bit=True)
    started = start_payload_copy(compressed, chunks, one_bit=True).wait()
    assert len(direct) == len(started) == len(trainer.plans)
    for a, b in zip(direct, started, strict=True):
        assert a.shape == b.shape and (a == b).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("one_bit", [True, False])
def test_overlapped_copy_gives_the_bytes_of_a_waited_one_on_cuda(one_bit):
    waited = _pipelined("cuda", overlapped=False, one_bit=one_bit)
    overlapped = _pipelined("cuda", overlapped=True, one_bit=one_bit)
    assert overlapped == waited
