"""A client split over a D x T device mesh (FSDP2 over D, tensor parallel over T) trains
like one device: real processes, gloo on loopback, the bundled tiny Llama.

The tolerances: a data-parallel gradient is the mean of D fp32 reduce-scatters (another
summation order than one device's), a tensor-parallel one sums partial matmuls; both
differ from one device by rounding only (~1e-7 here). The weights, though, must be
bit-identical: every change to them is elementwise and driven by the same decoded bytes."""

import pytest
import torch

from client_image.training.layout_check import check_layout
from client_image.training.parallel import (
    LLAMA_BLOCK_TP_PLAN,
    ParallelDims,
    ParallelismError,
    check_tp_divides,
    dp_share,
)
from client_image.training.sharded import shard_like

pytestmark = pytest.mark.slow


def test_one_rank_mesh_is_the_one_device_trainer_bit_for_bit():
    # The sharded trainer on a 1 x 1 mesh must be the same math as DistroTrainer: every
    # payload byte and every weight bit.
    report = check_layout(ParallelDims(1, 1), steps=4)
    assert report["payloads_identical"], report
    assert report["weights_identical"] and report["result_max_abs_diff"] == 0.0


def test_two_data_parallel_ranks_match_one_device():
    report = check_layout(ParallelDims(2, 1), steps=4)
    assert report["result_max_abs_diff"] <= 1e-4, report
    assert report["grad_max_abs_diff"] <= 1e-5 and report["logits_max_abs_diff"] <= 1e-5, report
    assert report["weights_identical"], report


def test_two_tensor_parallel_ranks_match_one_device():
    report = check_layout(ParallelDims(1, 2), steps=3)
    assert report["logits_max_abs_diff"] <= 1e-5, report
    assert report["grad_max_abs_diff"] <= 1e-5, report
    assert report["result_max_abs_diff"] <= 1e-4, report
    assert report["weights_identical"], report


def test_uneven_batches_weigh_each_share_by_its_rows():
    batch = torch.arange(10).view(5, 2)
    shares = [dp_share(batch, 2, i) for i in range(2)]
    assert [len(s) for s, _ in shares] == [3, 2]
    assert torch.equal(torch.cat([s for s, _ in shares]), batch)
    # sum_i weight_i * mean_i / D == the mean over all rows, for any per-row values
    values = torch.randn(5, dtype=torch.float64)
    means = [values[:3].mean(), values[3:].mean()]
    weighted = sum(w * m for (_, w), m in zip(shares, means, strict=True)) / 2
    assert float(weighted) == pytest.approx(float(values.mean()))
    assert sum(w for _, w in shares) == pytest.approx(2.0)
    assert [w for _, w in shares] == pytest.approx([1.2, 0.8])
    with pytest.raises(ParallelismError, match="cannot feed 4"):
        dp_share(batch[:3], 4, 0)


def test_tensor_parallelism_must_divide_heads_and_mlp():
    class Config:
        num_attention_heads, num_key_value_heads, intermediate_size = 4, 2, 384

    class Model(torch.nn.Module):
        config = Config()

    check_tp_divides(Model(), 2)
    with pytest.raises(ParallelismError, match="num_key_value_heads = 2"):
        check_tp_divides(Model(), 4)
    assert set(LLAMA_BLOCK_TP_PLAN.values()) == {"colwise", "rowwise"}


def test_a_replicated_tensor_is_its_own_shard():
    full = torch.randn(3, 4)
    assert shard_like(full, torch.empty(3, 4)) is full
