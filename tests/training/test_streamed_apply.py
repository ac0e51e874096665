"""Apply straight from wire bytes, a chunk of parameters at a time (wire.ResultStream,
DistroTrainer.apply_payloads): bit-identical to decoding every result first, and refusing
what it should. (That a chunk's decode is the whole one's: test_distro_step.py.)"""

from __future__ import annotations

import pytest
import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.formats.distro_wire import ResultStream, decode_result
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

OPTIMIZER = DistroOptimizer(compression_decay=0.999, compression_topk=8, compression_chunk=64,
                            quantize_1bit=True, clip_grad_norm=1.0, weight_decay=0.0)
SCHEDULE = ConstantLR(base_lr=1e-3, warmup_init_lr=1e-3, warmup_steps=0)


def trainer() -> DistroTrainer:
    return DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"), OPTIMIZER, SCHEDULE,
                         micro_batch_size=2)


def payloads_of(step: int, peers: int) -> list[bytes]:
    data = LocalDataProvider(TRAIN_DATA, 32)
    out = []
    for p in range(peers):
        producer = trainer()
        result = producer.train(step, data.get_samples(2 * p, 2 * p + 1), batch_id=(2 * p, 2 * p + 1))
        assert result.payload is not None
        out.append(result.payload)
    return out


def test_apply_payloads_moves_the_weights_exactly_as_apply_of_decoded_results() -> None:
    payloads = payloads_of(3, peers=12)  # 12 x k = 96 >= a + b for the small blocks too
    streamed, decoded = trainer(), trainer()
    assert streamed.apply_payloads(5, payloads) == 12
    assert decoded.apply(5, [decoded.decode(p) for p in payloads])
    for a, b in zip(streamed.params, decoded.params, strict=True):
        assert torch.equal(a, b)
    untouched = trainer()
    assert any(not torch.equal(a, b) for a, b in zip(streamed.params, untouched.params,
                                                     strict=True))


def test_apply_payloads_drops_other_steps_other_quantization_and_garbage() -> None:
    good = payloads_of(3, peers=2)
    values_mode = DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"),
                                OPTIMIZER.model_copy(update={"quantize_1bit": False}),
                                SCHEDULE, micro_batch_size=2)
    other = values_mode.train(3, LocalDataProvider(TRAIN_DATA, 32).get_samples(0, 1)).payload
    assert other is not None
    target = trainer()
    assert target.apply_payloads(5, [b"garbage", other, *good]) == 2
    assert target.apply_payloads(6, good) == 0  # results of step 3 are not step 4's


def test_a_result_stream_reads_the_tensors_decode_result_reads() -> None:
    payload = payloads_of(2, peers=1)[0]
    plans = trainer().plans
    whole = decode_result(payload, plans)
    stream = ResultStream(payload, plans)
    assert (stream.step, stream.one_bit) == (whole.step, whole.one_bit)
    with pytest.raises(IndexError):
        stream.tensor(1)  # not read in order yet
    for i in range(len(plans)):
        for _ in range(2):  # a tensor can be read again (apply's two passes)
            tensor = stream.tensor(i)
            assert torch.equal(tensor.idx, whole.tensors[i].idx)
            assert torch.equal(tensor.val, whole.tensors[i].val)
