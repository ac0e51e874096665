"""DistroTrainer: the per-step pipeline (docs/distro.md) on the real tiny model and data."""

import json
from pathlib import Path

import pytest
import torch
from golden_loss_curve import GOLDEN
from reproducible_numerics import run_reproducibly
from training_assets import TINY_MODEL, TRAIN_DATA, VALIDATION_DATA

from client_image.formats.distro_wire import ResultDecodeError
from client_image.training.model import load_causal_lm
from client_image.training.simulate import Simulation, SimulationConfig, validation_loss
from client_image.training.trainer import DistroTrainer
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

GOLDEN_CURVE = Path(__file__).parent / "golden_loss_curve.py"
DISTRO = DistroOptimizer(
    compression_decay=0.999, compression_topk=8, compression_chunk=64, quantize_1bit=True,
    clip_grad_norm=1.0, weight_decay=0.1,
)


def _simulation(steps: int, lr: float, peers: int = 2, seq_len: int = 32, warmup: int = 0) -> Simulation:
    config = SimulationConfig(
        model=TINY_MODEL, data=TRAIN_DATA, steps=steps, total_batch=2 * peers, micro_batch=1,
        peers=peers, seq_len=seq_len, seed=3, distro=DISTRO,
        lr_schedule=ConstantLR(base_lr=lr, warmup_init_lr=0.0, warmup_steps=warmup),
    )
    return Simulation(config)


def _trainer(lr=1e-3, optimizer=DISTRO) -> DistroTrainer:
    model = load_causal_lm(TINY_MODEL, device="cpu")
    schedule = ConstantLR(base_lr=lr, warmup_init_lr=0.0, warmup_steps=0)
    return DistroTrainer(model, optimizer, schedule, micro_batch_size=2)


def _batch(start=0, n=2, seq_len=32):
    return LocalDataProvider(TRAIN_DATA, seq_len).get_samples(start, start + n - 1)


def test_golden_loss_curve_of_a_fixed_seed():
    """Two peers, 8 steps: any change to the update rule, the wire or the data moves it
    (recorded and run under pinned CPU numerics: golden_loss_curve.py)."""
    losses = json.loads(run_reproducibly(GOLDEN_CURVE, "--print"))
    golden = json.loads(GOLDEN.read_text())["losses"]
    # Steps 0 and 1 train the initial weights; from step 2 on the applied updates show.
    assert losses == pytest.approx(golden, abs=2e-3)
    assert losses[-1] < losses[0] - 0.2


def test_distro_lowers_the_validation_loss_on_the_bundled_data():
    simulation = _simulation(steps=12, lr=6e-3, peers=2, seq_len=32)
    before = validation_loss(simulation.model, VALIDATION_DATA, 32, samples=32)
    list(simulation.run())
    after = validation_loss(simulation.model, VALIDATION_DATA, 32, samples=32)
    assert after < before - 0.5, (before, after)


def test_payload_bytes_are_deterministic():
    a, b = _trainer(), _trainer()
    out_a = a.train(0, _batch(), batch_id=(0, 1))
    out_b = b.train(0, _batch(), batch_id=(0, 1))
    assert out_a.payload == out_b.payload
    assert out_a.payload != a.train(1, _batch(2), batch_id=(2, 3)).payload


def test_apply_moves_every_weight_by_lr_times_sign_of_the_aggregate():
    trainer, peer = _trainer(lr=1e-3), _trainer(lr=1e-3)
    own = trainer.decode(trainer.train(0, _batch(0), batch_id=(0, 1)).payload)
    other = peer.decode(peer.train(0, _batch(2), batch_id=(2, 3)).payload)
    before = [p.detach().clone() for p in trainer.params]
    assert trainer.apply(2, [own, other])
    moved = {
        name: (p.detach() - b).abs()
        for name, p, b in zip(trainer.names, trainer.params, before, strict=True)
    }
    # sign(aggregate) is +-1 wherever the aggregate is nonzero: steps of exactly lr.
    for step in moved.values():
        nonzero = step[step > 0]
        assert torch.allclose(nonzero, torch.full_like(nonzero, 1e-3), rtol=1e-2)
    # The input embedding's gradient is zero outside the rows of the batches' tokens: a
    # 64x64 block of rows no token hit has an all-zero momentum, sends nothing and stays put.
    tokens = torch.cat([_batch(0), _batch(2)]).unique()
    hit = torch.zeros(4096 // 64, dtype=torch.bool)
    hit[tokens // 64] = True
    embed = moved["model.embed_tokens.weight"].view(64, 64, 128)
    assert not embed[~hit].any()
    assert (embed[hit] > 0).float().mean() > 0.9
    for name, step in moved.items():
        if name != "model.embed_tokens.weight":
            assert (step > 0).float().mean() > 0.9, name


def _warmup_trainer(lr=1e-3) -> DistroTrainer:
    model = load_causal_lm(TINY_MODEL, device="cpu")
    schedule = ConstantLR(base_lr=lr, warmup_init_lr=0.0, warmup_steps=4)
    return DistroTrainer(model, DISTRO, schedule, micro_batch_size=2)


def test_a_step_0_result_of_an_lr_0_schedule_moves_no_weight():
    # A schedule warming up from 0 makes step 0's momentum lr(0) * grad all zero. Its
    # result used to decode to +1 for every coefficient (a zero has no sign bit), and
    # applying it moved every weight by lr(2) with no gradient behind it.
    trainer = _warmup_trainer()
    assert trainer.learning_rate(0) == 0.0 and trainer.learning_rate(2) > 0
    result = trainer.decode(trainer.train(0, _batch(0), batch_id=(0, 1)).payload)
    assert all(not tensor.val.any() for tensor in result.tensors)
    before = [p.detach().clone() for p in trainer.params]
    assert trainer.apply(2, [result])
    assert all(torch.equal(p, b) for p, b in zip(trainer.params, before, strict=True))


def test_an_all_zero_result_does_not_dilute_the_others():
    zero_peer, peer = _warmup_trainer(), _trainer(lr=1e-3)
    zero = zero_peer.decode(zero_peer.train(0, _batch(0), batch_id=(0, 1)).payload)
    other = peer.decode(peer.train(0, _batch(2), batch_id=(2, 3)).payload)
    alone, joined = _warmup_trainer(), _warmup_trainer()
    alone.apply(2, [other])
    joined.apply(2, [other, zero])
    assert all(torch.equal(a, b) for a, b in zip(alone.params, joined.params, strict=True))


def test_apply_without_results_changes_nothing():
    trainer = _trainer()
    before = [p.detach().clone() for p in trainer.params]
    assert trainer.apply(2, []) is False
    assert all(torch.equal(p, b) for p, b in zip(trainer.params, before, strict=True))


def test_error_feedback_removes_the_transmitted_part_from_delta():
    no_decay = DISTRO.model_copy(update={"compression_decay": 1.0, "weight_decay": None})
    trainer = _trainer(lr=1e-3, optimizer=no_decay)
    trainer.train(0, _batch(0), batch_id=(0, 1))
    delta_after_first = trainer.delta_tensors()
    energy_before = sum(float(d.norm() ** 2) for d in delta_after_first)
    trainer.train(1, _batch(2), batch_id=(2, 3))
    grads = [p.grad for p in trainer.params]
    # delta_2 = delta_1 - sent_1 + lr * g_2, so delta_2 - lr*g_2 is delta_1 minus its top-k part.
    residual = [d - 1e-3 * g for d, g in zip(trainer.delta_tensors(), grads, strict=True)]
    energy_after = sum(float(r.norm() ** 2) for r in residual)
    assert energy_after < energy_before * 0.999


def test_cold_start_zeroes_the_momentum():
    trainer = _trainer()
    trainer.train(0, _batch(0), batch_id=(0, 1))
    assert any(float(d.abs().sum()) > 0 for d in trainer.delta_tensors())
    trainer.train(1, _batch(2), batch_id=(2, 3), cold_start=True)
    # Only this step's lr * grad is left.
    for delta, param in zip(trainer.delta_tensors(), trainer.params, strict=True):
        assert torch.allclose(delta, 1e-3 * param.grad, atol=1e-9)


def test_a_result_of_the_wrong_quantization_is_rejected():
    full = DISTRO.model_copy(update={"quantize_1bit": False})
    bf16_peer = _trainer(optimizer=full)
    payload = bf16_peer.train(0, _batch(), batch_id=(0, 1)).payload
    with pytest.raises(ResultDecodeError, match="quantize_1bit"):
        _trainer().decode(payload)


def test_learning_rate_applies_the_cold_start_factor():
    model = load_causal_lm(TINY_MODEL, device="cpu")
    trainer = DistroTrainer(
        model, DISTRO, ConstantLR(base_lr=1.0, warmup_init_lr=0.0, warmup_steps=0),
        micro_batch_size=1, cold_start_warmup_steps=4, start_step=10,
    )
    assert [trainer.learning_rate(s) for s in (9, 10, 12, 14, 15)] == [1.0, 0.0, 0.5, 1.0, 1.0]


def test_results_of_another_step_are_rejected_or_dropped_never_raised_in_apply():
    trainer = _trainer()
    payload = trainer.train(0, _batch(), batch_id=(0, 1)).payload
    with pytest.raises(ResultDecodeError, match="for step 0, expected 1"):
        trainer.decode(payload, expected_step=1)
    before = [p.detach().clone() for p in trainer.params]
    assert trainer.apply(3, [trainer.decode(payload)]) is False
    assert all(torch.equal(p, b) for p, b in zip(trainer.params, before, strict=True))


def test_bf16_model_trains_and_publishes_a_decodable_result():
    model = load_causal_lm(TINY_MODEL, dtype="bf16", device="cpu")
    schedule = ConstantLR(base_lr=1e-3, warmup_init_lr=0.0, warmup_steps=0)
    trainer = DistroTrainer(model, DISTRO, schedule, micro_batch_size=2)
    assert trainer.delta[0].dtype == torch.float32  # the DisTrO buffer stays fp32 (precision.py)
    first = trainer.decode(trainer.train(0, _batch(), batch_id=(0, 1)).payload)
    trainer.train(1, _batch(2), batch_id=(2, 3))
    assert trainer.apply(2, [first])


def test_idling_a_step_changes_the_weights_exactly_as_training_it():
    # A client with no batch in a round must end the step with the trainers' weights: the
    # lookahead is undone exactly, so only the weight decay is left to repeat.
    trainer, idler = _trainer(), _trainer()
    for step in range(3):
        trainer.train(step, _batch(2 * step))
        idler.idle(step)
        for ours, theirs in zip(trainer.params, idler.params, strict=True):
            assert torch.equal(ours, theirs)
    assert not torch.equal(trainer.params[0], _trainer().params[0])  # decay did happen
