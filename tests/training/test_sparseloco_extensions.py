"""SparseLoCo's config extensions (issue 34): tensors sent whole below dense_max_numel and
the Nesterov outer momentum; both off by default, both keep the peers bit-identical."""

import pytest
import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.training.distro import BlockLayout
from client_image.training.model import load_causal_lm
from client_image.training.simulate import Simulation, SimulationConfig
from client_image.training.sparseloco import compress_error, mean_update, plan_model, split_groups
from client_image.training.sparseloco_trainer import SparseLoCoTrainer
from client_image.training.sparseloco_wire import decode_sparseloco, encode_sparseloco
from coordinator.config import ConstantLR, SparseLoCoOptimizer
from psyche_common.token_files.local import LocalDataProvider

CONFIG = SparseLoCoOptimizer(inner_steps=2, inner_lr=2e-3, topk_density=1 / 64, chunk=64,
                             quant_bits=2, error_decay=0.95, outer_lr=1.0, clip_grad_norm=1.0)
CONSTANT = ConstantLR(base_lr=1.0, warmup_init_lr=0.0, warmup_steps=0)
SHAPES = [("w", (128, 64)), ("norm", (96,)), ("odd", (7, 5))]


def test_defaults_are_the_papers_algorithm():
    assert CONFIG.outer_momentum == 0.0 and CONFIG.dense_max_numel == 0
    assert [p.topk for p in plan_model(SHAPES, 64, 1 / 64)] == [64, 1, 1]


def test_small_tensors_are_sent_whole_and_round_trip():
    plans = plan_model(SHAPES, 64, 1 / 64, dense_max_numel=96)
    assert [p.topk for p in plans] == [64, 48, 35]  # whole blocks; the matrix keeps its density
    generator = torch.Generator().manual_seed(3)
    error = [torch.randn(shape, generator=generator) for _, shape in SHAPES]
    layout = BlockLayout(plans)
    groups = compress_error(layout.gather(error), layout, 2)
    payload = encode_sparseloco(groups, plans, layout.slots, quant_bits=2, step=1,
                                trainer_nonce=0, batch_start=0, batch_end=1)
    decoded = decode_sparseloco(payload, plans, 2)
    for sent, got in zip(split_groups(groups, layout), decoded.tensors, strict=True):
        assert torch.equal(sent.val, got.val)
    norm = mean_update([decoded.tensors[1]], plans[1], torch.float32, "cpu")
    assert bool((norm != 0).all())  # every coefficient of the norm arrived, sign kept
    assert torch.equal(torch.sign(norm), torch.sign(error[1]))
    with pytest.raises(ValueError, match="dense_max_numel"):
        SparseLoCoOptimizer(**{**CONFIG.model_dump(), "dense_max_numel": -1})


def test_outer_momentum_is_nesterov_on_the_mean_update():
    data = LocalDataProvider(TRAIN_DATA, 32)
    mu = 0.5
    model = load_causal_lm(TINY_MODEL, device="cpu")
    trainer = SparseLoCoTrainer(model, CONFIG.model_copy(update={"outer_momentum": mu}),
                                CONSTANT, micro_batch_size=2, lookahead=False)
    results = [trainer.decode(trainer.train(s, data.get_samples(2 * s, 2 * s + 1)).payload)
               for s in range(2)]
    theta = [p.detach().clone() for p in trainer.params]
    updates = [[mean_update([r.tensors[i]], plan, torch.float32, "cpu")
                for i, plan in enumerate(trainer.plans)] for r in results]
    velocity = [torch.zeros_like(t) for t in theta]
    for step, update in zip((2, 3), updates, strict=True):
        assert trainer.apply(step, [results[step - 2]])
        for i, g in enumerate(update):
            velocity[i] = mu * velocity[i] + g
            theta[i] = theta[i] - CONFIG.outer_lr * (g + mu * velocity[i])
        for expected, param in zip(theta, trainer.params, strict=True):
            torch.testing.assert_close(param.detach(), expected, rtol=0, atol=1e-6)
    trainer.reset_delta()
    assert not any(bool(v.any()) for v in trainer.outer_velocity)


def test_peers_stay_bit_identical_with_both_extensions():
    config = SimulationConfig(
        model=TINY_MODEL, data=TRAIN_DATA, steps=8, total_batch=4, micro_batch=1, peers=2,
        seq_len=32, seed=5, optimizer="sparseloco", lr_schedule=CONSTANT,
        sparseloco=CONFIG.model_copy(update={"outer_momentum": 0.5, "dense_max_numel": 4096}))
    simulation = Simulation(config)
    losses = [report.loss for report in simulation.run()]
    first, second = simulation.distro
    assert all(torch.equal(a, b) for a, b in zip(first.params, second.params, strict=True))
    assert losses[-1] < losses[0]
