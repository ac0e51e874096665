"""torch.compile of the grouped top-k selection (DistroStep(compile_kernels=True), off by
default until measured on a GPU): on CPU it gives the same payload bytes and weights as
the eager kernel."""

from __future__ import annotations

import hashlib

import pytest
import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.training import distro_step
from client_image.training.distro import dct_blocks, plan_model, topk_blocks
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

DISTRO = DistroOptimizer(
    compression_decay=0.999, compression_topk=8, compression_chunk=64, quantize_1bit=True,
    clip_grad_norm=1.0, weight_decay=0.1,
)


def test_compiled_topk_selects_what_the_eager_one_does():
    """Group shapes of a Llama (a matrix's (64, 64) blocks, a vector's (64, 1), a small
    (16, 8)), after the eager DCT, with ties and zeros among the coefficients."""
    generator = torch.Generator().manual_seed(5)
    compiled = distro_step.compiled_topk()
    for n, a, b, k in ((300, 64, 64, 8), (96, 64, 1, 8), (40, 16, 8, 5)):
        coefficients = dct_blocks(torch.randn(n, a, b, generator=generator))
        coefficients[: n // 4] = 0  # all-zero blocks: empty slots
        coefficients[n // 4: n // 2, :2] = 1.0  # equal nonzero magnitudes
        got = compiled(coefficients, k)
        expected = topk_blocks(coefficients, k)
        assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True)), (a, b)


def test_compile_kernels_is_off_by_default():
    plans = plan_model([("w", (8, 8))], 8, 2)
    param = torch.nn.Parameter(torch.zeros(8, 8))
    step = distro_step.DistroStep([param], plans, distro_step.WholeParameters())
    assert step.topk is topk_blocks


def _steps(compile_kernels: bool, one_bit: bool) -> tuple[list[bytes], str]:
    torch.manual_seed(0)
    model = load_causal_lm(TINY_MODEL, device="cpu")
    schedule = ConstantLR(base_lr=1e-3, warmup_init_lr=0.0, warmup_steps=0)
    optimizer = DISTRO.model_copy(update={"quantize_1bit": one_bit})
    trainer = DistroTrainer(model, optimizer, schedule, micro_batch_size=2,
                            compile_kernels=compile_kernels)
    assert (trainer.distro.topk is topk_blocks) is not compile_kernels
    provider = LocalDataProvider(TRAIN_DATA, 32)
    payloads: list[bytes] = []
    for step in range(4):
        if step >= 2:
            trainer.apply_payloads(step, [payloads[step - 2]])
        out = trainer.train(step, provider.get_samples(2 * step, 2 * step + 1))
        assert out.payload is not None
        payloads.append(out.payload)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in trainer.params))
    return payloads, digest.hexdigest()


@pytest.mark.parametrize("one_bit", [True, False])
def test_compiled_kernels_give_the_eager_bytes_and_weights_on_cpu(one_bit):
    eager = _steps(compile_kernels=False, one_bit=one_bit)
    compiled = _steps(compile_kernels=True, one_bit=one_bit)
    assert len(set(eager[0])) == 4  # four distinct payloads: the comparison means something
    assert compiled == eager
