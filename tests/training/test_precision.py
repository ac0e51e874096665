"""Precision (client_image/training/precision.py): bf16 compute trains like fp32, micro-
batches accumulate to the full batch, and why DisTrO's buffers stay fp32."""

import pytest
import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.training import load_causal_lm
from client_image.training.objective import causal_lm_loss
from client_image.training.precision import PrecisionError, resolve_compute_dtype
from client_image.training.simulate import Simulation, SimulationConfig
from psyche_common.token_files.local import LocalDataProvider


def test_auto_is_bf16_on_cuda_and_fp32_elsewhere() -> None:
    assert resolve_compute_dtype("auto", "cpu") == "fp32"
    assert resolve_compute_dtype("auto", "cuda:1") == "bf16"
    assert resolve_compute_dtype("bf16", "cpu") == "bf16"
    with pytest.raises(PrecisionError, match="unknown dtype 'fp16'"):
        resolve_compute_dtype("fp16", "cpu")


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_micro_batches_accumulate_to_the_full_batch(compute) -> None:
    batch = LocalDataProvider(TRAIN_DATA, 64).get_samples(0, 3)

    def gradients(micro: int) -> tuple[float, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = load_causal_lm(TINY_MODEL, device="cpu")
        loss = causal_lm_loss(model, batch, micro, compute)
        return loss, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    full_loss, full = gradients(4)
    micro_loss, micro = gradients(1)
    assert all(g.dtype == torch.float32 for g in micro)  # accumulated in fp32
    # fp32: the same sum in another order; bf16: each micro-batch rounds on its own.
    tolerance = 1e-5 if compute == "fp32" else 2e-2
    assert micro_loss == pytest.approx(full_loss, rel=tolerance)
    for a, b in zip(full, micro, strict=True):
        assert torch.allclose(a, b, rtol=tolerance, atol=tolerance * float(a.abs().max()))


def _losses(**overrides: object) -> list[float]:
    config = SimulationConfig(model=TINY_MODEL, data=TRAIN_DATA, steps=50, total_batch=4,
                              micro_batch=2, peers=2, seq_len=64, **overrides)
    return [report.loss for report in Simulation(config).run()]


@pytest.mark.slow
def test_bf16_compute_trains_within_3_percent_of_fp32() -> None:
    fp32, bf16 = _losses(compute="fp32"), _losses(compute="bf16")
    final_fp32, final_bf16 = sum(fp32[-10:]) / 10, sum(bf16[-10:]) / 10
    assert final_fp32 < sum(fp32[:5]) / 5 - 0.5  # it learned
    assert final_bf16 / final_fp32 <= 1.03, (final_bf16, final_fp32)


def test_bf16_would_round_away_what_the_distro_buffer_accumulates() -> None:
    """delta <- 0.999 delta + lr g: with lr g a thousandth of delta (lr 1e-3 on gradients
    of delta's size), bf16's 8-bit mantissa cannot hold the sum: the buffer stops moving,
    while fp32 keeps every step."""
    delta = torch.full((1000,), 1e-2)
    step = torch.full((1000,), 1e-5)  # lr * g
    kept = {}
    for dtype in (torch.float32, torch.bfloat16):
        d = delta.to(dtype)
        for _ in range(100):
            d = d * 1.0 + step.to(dtype)  # decay left out: only the increments matter here
        kept[dtype] = float((d.float() - delta).mean())
    assert kept[torch.float32] == pytest.approx(100 * 1e-5, rel=1e-3)
    assert kept[torch.bfloat16] < 0.1 * kept[torch.float32]
