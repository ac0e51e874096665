"""The one DisTrO step (training/distro_step.py): its grouping into chunks changes no
number, its payload slots are the wire's, and its kernel count does not grow with the
number of parameter tensors (bench/distro_step_cost.py)."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.formats import distro_wire
from client_image.formats.blocks import SparseResult
from client_image.formats.distro_wire import encode_result, encode_slots
from client_image.training import distro_step
from client_image.training.distro import compress, decompress, plan_model
from client_image.training.distro_step import (
    decode_chunk,
    payload_slots,
    per_parameter,
    plan_chunks,
    unstack_blocks,
)
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

SHAPES = [("a", (64, 48)), ("v", (96,)), ("experts", (2, 32, 32)), ("b", (256, 160)),
          ("c", (64, 48)), ("w", (7, 33))]


class _Result:
    def __init__(self, tensors: list[SparseResult]) -> None:
        self.tensors = tensors

    def tensor(self, i: int) -> SparseResult:
        return self.tensors[i]


def peer_results(peers: int, one_bit: bool) -> tuple[list[_Result], list]:
    plans = plan_model(SHAPES, 16, 4)
    generator = torch.Generator().manual_seed(peers)
    out = []
    for p in range(peers):
        sparse = compress([torch.randn(s, generator=generator) for _, s in SHAPES], plans)
        tensors = []
        for t in sparse:
            val = torch.sign(t.val) if one_bit else t.val.to(torch.bfloat16)
            if p % 3 == 1:  # some empty slots, as short blocks decode
                val = val.clone()
                val[:, -1] = 0
            tensors.append(SparseResult(t.idx, val))
        out.append(_Result(tensors))
    return out, plans


def test_chunks_are_consecutive_parameters_within_the_budget():
    plans = plan_model(SHAPES, 16, 4)
    for budget in (1, 3000, 5000, 10**9):
        chunks = plan_chunks(plans, budget)
        assert [c.first for c in chunks] == [0] + [c.stop for c in chunks[:-1]]
        assert chunks[-1].stop == len(plans)
        limit = max(budget, *(p.numel for p in plans))
        for chunk, following in itertools.pairwise(chunks):
            assert chunk.numel <= limit
            assert chunk.numel + plans[following.first].numel > limit  # filled greedily
    assert len(plan_chunks(plans, 10**9)) == 1
    assert len(plan_chunks(plans, 1)) == 3  # the largest parameter (256 x 160) sets it


@pytest.mark.parametrize("peers", [1, 2, 3, 17])
@pytest.mark.parametrize("one_bit", [False, True])
def test_a_chunked_decode_is_bit_identical_to_the_whole_model_at_once(peers, one_bit):
    results, plans = peer_results(peers, one_bit)
    whole = decompress([r.tensors for r in results], plans, torch.float32, "cpu")
    for budget in (1, 5000, 10**9):
        decoded = []
        for chunk in plan_chunks(plans, budget):
            decoded += unstack_blocks(decode_chunk(results, chunk, "cpu", torch.float32), chunk)
        assert all(torch.equal(a, b) for a, b in zip(decoded, whole, strict=True)), budget


@pytest.mark.parametrize("one_bit", [False, True])
def test_the_payload_slots_encode_as_the_per_tensor_encoder_does(one_bit):
    plans = plan_model(SHAPES, 16, 4)
    generator = torch.Generator().manual_seed(5)
    tensors = [torch.randn(s, generator=generator) for _, s in SHAPES]
    tensors[1].zero_()  # an all-zero parameter sends nothing
    tensors[0][:16] = 1e-39  # rounds to a bfloat16 zero, which is never sent
    for budget in (1, 10**9):
        chunks = plan_chunks(plans, budget)
        compressed = [distro_step.compress_chunk(tensors[c.first:c.stop], c) for c in chunks]
        header = {"step": 3, "trainer_nonce": 1, "batch_start": 4, "batch_end": 9,
                  "one_bit": one_bit}
        assert encode_slots(payload_slots(compressed, chunks, one_bit), plans, **header) == \
            encode_result(per_parameter(compressed, chunks), plans, **header)


def _train_and_apply(steps: int) -> tuple[list[bytes], list[torch.Tensor]]:
    optimizer = DistroOptimizer(compression_decay=0.999, compression_topk=8,
                                compression_chunk=64, quantize_1bit=False, clip_grad_norm=1.0,
                                weight_decay=0.1)
    trainer = DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"), optimizer,
                            ConstantLR(base_lr=1e-3, warmup_init_lr=1e-3, warmup_steps=0),
                            micro_batch_size=2)
    data = LocalDataProvider(TRAIN_DATA, 32)
    payloads: list[bytes] = []
    for step in range(steps):
        if step >= 2:
            trainer.apply_payloads(step, [payloads[step - 2], payloads[step - 2]])
        out = trainer.train(step, data.get_samples(2 * step, 2 * step + 1))
        assert out.payload is not None
        payloads.append(out.payload)
    return payloads, [p.detach().clone() for p in trainer.params]


def test_a_step_in_many_chunks_gives_the_bytes_and_weights_of_one_chunk(monkeypatch):
    one_chunk = _train_and_apply(4)
    monkeypatch.setattr(distro_step, "STEP_CHUNK_ELEMENTS", 1)  # the largest parameter's
    many = _train_and_apply(4)
    assert many[0] == one_chunk[0]
    assert all(torch.equal(a, b) for a, b in zip(many[1], one_chunk[1], strict=True))


def _bench_module():
    path = Path(__file__).resolve().parents[2] / "bench" / "distro_step_cost.py"
    spec = importlib.util.spec_from_file_location("distro_step_cost", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kernels_of_a_step_do_not_grow_with_the_number_of_tensors(tmp_path):
    figures = _bench_module().ops_growth(tmp_path)
    # The tiny model has 39 parameter tensors, twice the layers 75: a per-tensor loop
    # would show in the count (1184 operators per step, growth 1.89, before grouping).
    assert 0 < figures["distro_ops_per_step"] < 300
    assert figures["distro_ops_growth"] <= 1.10


def test_unpack_uints_inverts_pack_uints_for_every_width() -> None:
    """The per-residue strided decode of packed indices (distro_wire.unpack_uints) gives back what
    pack_uints wrote, at every width and for counts that are not multiples of 8."""
    rng = np.random.default_rng(0)
    for width in range(1, 65):
        for count in (0, 1, 7, 8, 9, 333):
            top = 2 ** min(width, 63)
            values = rng.integers(0, top, count, dtype=np.uint64)
            if width == 64:
                values = values * np.uint64(2) + np.uint64(1)  # the top bit set too
            unpacked = distro_wire.unpack_uints(distro_wire.pack_uints(values, width), width, count)
            assert unpacked.dtype == np.uint64
            assert np.array_equal(unpacked, values), (width, count)
    with pytest.raises(ValueError, match="fewer than 9 values of 12 bits"):
        distro_wire.unpack_uints(bytes(13), 12, 9)
