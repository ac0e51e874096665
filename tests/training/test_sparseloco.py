"""SparseLoCo: the quantizer, the wire format (and what it refuses), and the trainer's
round on the real tiny model (clients end bit-identical)."""

import struct
from pathlib import Path

import pytest
import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.formats.distro_wire import ResultDecodeError
from client_image.training.distro import BlockLayout
from client_image.training.model import load_causal_lm
from client_image.training.objective import causal_lm_loss
from client_image.training.simulate import Simulation, SimulationConfig
from client_image.training.sparseloco import (
    block_topk,
    compress_error,
    dequantize,
    mean_update,
    plan_model,
    quantize,
    split_groups,
    subtract_sent,
)
from client_image.training.sparseloco_trainer import SparseLoCoTrainer
from client_image.training.sparseloco_wire import decode_sparseloco, encode_sparseloco
from coordinator.config import ConfigError, ConstantLR, SparseLoCoOptimizer, parse_state_toml
from psyche_common.token_files.local import LocalDataProvider

CONFIG = SparseLoCoOptimizer(inner_steps=2, inner_lr=2e-3, topk_density=1 / 64, chunk=64,
                             quant_bits=2, error_decay=0.95, outer_lr=1.0, clip_grad_norm=1.0)
ROOT = Path(__file__).resolve().parents[2]
SHAPES = [("w", (128, 64)), ("v", (96,)), ("odd", (7, 5))]


def _encode(error, bits=2, step=3):
    plans = plan_model(SHAPES, 64, 1 / 64)
    layout = BlockLayout(plans)
    buffers = layout.gather(error)
    groups = compress_error(buffers, layout, bits)
    payload = encode_sparseloco(groups, plans, layout.slots, quant_bits=bits, step=step,
                                trainer_nonce=1, batch_start=4, batch_end=7)
    return plans, layout, buffers, groups, payload


def _error(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for _, shape in SHAPES]


def test_block_k_follows_the_density():
    assert [p.topk for p in plan_model(SHAPES, 64, 1 / 64)] == [64, 1, 1]
    assert block_topk(4096, 0.02) == 82 and block_topk(10, 1.0) == 10 and block_topk(3, 1e-6) == 1


@pytest.mark.parametrize("bits", [2, 3, 8])
def test_quantizer_keeps_signs_and_the_block_maximum(bits):
    val = torch.tensor([[0.5, -1.0, 0.26, 0.0], [0.0, 0.0, 0.0, 0.0]])
    idx = torch.tensor([[0, 1, 2, 0], [0, 0, 0, 0]])
    q = quantize(idx, val, bits)
    assert torch.equal(torch.sign(q.values), torch.sign(val))
    assert float(q.values[0, 1]) == -1.0  # the block's largest magnitude is its scale
    levels = 1 << (bits - 1)
    assert float((q.values[0, :3].abs() - val[0, :3].abs()).abs().max()) <= 0.5 / levels + 1e-6
    assert float(q.scale[1]) == 0 and not bool(q.values[1].any())
    sent = val != 0
    assert torch.equal(dequantize(q.code, q.scale, sent, bits), q.values)


def test_residual_keeps_exactly_what_was_not_sent():
    plans, layout, buffers, groups, _ = _encode(_error())
    before = [b.clone() for b in buffers]
    subtract_sent(buffers, groups)
    sent = [before_g - after_g for before_g, after_g in zip(before, buffers, strict=True)]
    rebuilt = layout.gather([mean_update([t], plan, torch.float32, "cpu")
                             for t, plan in zip(split_groups(groups, layout), plans, strict=True)])
    for s, r in zip(sent, rebuilt, strict=True):
        torch.testing.assert_close(s, r, rtol=0, atol=1e-6)


def test_wire_round_trip_and_determinism():
    plans, layout, _, groups, payload = _encode(_error(1))
    decoded = decode_sparseloco(payload, plans, 2)
    assert (decoded.step, decoded.trainer_nonce, decoded.batch_start, decoded.batch_end) == (3, 1, 4, 7)
    for got, want in zip(decoded.tensors, split_groups(groups, layout), strict=True):
        assert torch.equal(got.idx, want.idx) and torch.equal(got.val, want.val)
    assert _encode(_error(1))[4] == payload  # same inputs, same bytes
    # 12-bit indices + 2-bit codes per value, a bf16 scale per block, small headers.
    values = sum(p.n_blocks * p.topk for p in plans)
    assert len(payload) < values * 14 / 8 + 2 * sum(p.n_blocks for p in plans) + 60


def test_zero_blocks_send_nothing():
    error = _error(2)
    error[0][:64].zero_()  # the first block-row of w is all zero
    plans, _, _, _, payload = _encode(error)
    decoded = decode_sparseloco(payload, plans, 2)
    assert not bool(decoded.tensors[0].val[0].any())
    assert bool(decoded.tensors[0].val[1].any())


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b"XXXX" + b[4:], "bad magic"),
    (lambda b: b[:4] + bytes([9]) + b[5:], "wire version"),
    (lambda b: b[:5] + bytes([3]) + b[6:], "quant_bits 3"),
    (lambda b: b[:6] + bytes([0x80]) + b[7:], "unknown flags"),
    (lambda b: b[:-1], "truncated"),
    (lambda b: b + b"\0", "trailing"),
])
def test_hostile_payloads_are_refused_with_a_reason(mutate, message):
    plans, _, _, _, payload = _encode(_error(3))
    with pytest.raises(ResultDecodeError, match=message):
        decode_sparseloco(mutate(payload), plans, 2)


def test_a_non_canonical_scale_is_refused():
    """Codes all below the top level (the same values could be sent at half the scale)."""
    plans, _, _, _, payload = _encode(_error(4))
    header = struct.calcsize("<4sBBBIIQQ") + 1  # fixed header + the tensor count varint
    body = bytearray(payload)
    # The last tensor ("odd", one 7x5 block, k = 1): its single 2-bit code is the last byte.
    assert plans[-1].n_blocks == 1 and header < len(body)
    body[-1] &= 0b01  # level 0 instead of the top level 1
    with pytest.raises(ResultDecodeError, match="not canonical"):
        decode_sparseloco(bytes(body), plans, 2)


def test_trainer_round_moves_weights_only_through_apply():
    model = load_causal_lm(TINY_MODEL, device="cpu")
    trainer = SparseLoCoTrainer(model, CONFIG, ConstantLR(base_lr=1.0, warmup_init_lr=0.0,
                                                          warmup_steps=0), micro_batch_size=2)
    before = [p.detach().clone() for p in trainer.params]
    batch = LocalDataProvider(TRAIN_DATA, 32).get_samples(0, 3)
    out = trainer.train(0, batch, batch_id=(0, 3))
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.params, strict=True))
    assert out.payload is not None and out.loss > 0
    assert trainer.inner.state  # the inner AdamW took its steps
    result = trainer.decode(out.payload, expected_step=0)
    assert trainer.apply(2, [result])
    moved = sum(int((a != b).sum()) for a, b in zip(before, trainer.params, strict=True))
    kept = sum(int((t.val != 0).sum()) for t in result.tensors)
    assert 0 < moved <= kept  # only the sent coordinates move
    with pytest.raises(ResultDecodeError, match="expected 5"):
        trainer.decode(out.payload, expected_step=5)


def test_simulated_peers_stay_bit_identical_and_learn():
    config = SimulationConfig(model=TINY_MODEL, data=TRAIN_DATA, steps=8, total_batch=4,
                              micro_batch=1, peers=2, seq_len=32, seed=5,
                              optimizer="sparseloco", sparseloco=CONFIG,
                              lr_schedule=ConstantLR(base_lr=1.0, warmup_init_lr=0.0,
                                                     warmup_steps=0))
    simulation = Simulation(config)
    losses = [report.loss for report in simulation.run()]
    assert len(losses) == 4  # 8 steps of 2 inner steps each
    first, second = simulation.distro
    assert all(torch.equal(a, b) for a, b in zip(first.params, second.params, strict=True))
    assert losses[-1] < losses[0]


def _state_toml_with(optimizer_section: str) -> str:
    text = (ROOT / "config" / "local-testnet" / "state.toml").read_text()
    head = text[: text.index("[model.LLM.optimizer.Distro]")]
    return head + optimizer_section


SPARSELOCO_SECTION = """[model.LLM.optimizer.SparseLoCo]
inner_steps = 4
inner_lr = 0.002
topk_density = 0.015625
chunk = 64
quant_bits = QB
error_decay = 0.95
outer_lr = 1.0
"""


def test_config_accepts_sparseloco_and_names_a_bad_field():
    state = parse_state_toml(_state_toml_with(SPARSELOCO_SECTION.replace("QB", "2")))
    optimizer = state.model.optimizer
    assert isinstance(optimizer, SparseLoCoOptimizer) and optimizer.inner_steps == 4
    with pytest.raises(ConfigError, match="quant_bits"):
        parse_state_toml(_state_toml_with(SPARSELOCO_SECTION.replace("QB", "1")))


def _gap_section(idx_rows, k, block_numel=4096):
    from client_image.formats.blocks import BlockPlan
    from client_image.training.sparseloco_wire import encode_gaps

    n = len(idx_rows)
    plan = BlockPlan("t", (n * 64, 64), n * 64, 64, 64, 64, k)
    assert plan.block_numel == block_numel
    idx = torch.zeros(n, k, dtype=torch.int64)
    used = torch.zeros(n, k, dtype=torch.bool)
    for row, values in enumerate(idx_rows):
        idx[row, : len(values)] = torch.tensor(values)
        used[row, : len(values)] = True
    return plan, used, encode_gaps(idx.numpy(), used.numpy())


def _read(plan, used, section):
    from client_image.formats.distro_wire import Reader
    from client_image.training.sparseloco_wire import read_gaps

    reader = Reader(section)
    out = read_gaps(reader, plan, used.sum(dim=1).numpy())
    assert reader.remaining == 0
    return out


def test_rice_coded_indices_round_trip_and_are_compact():
    rows = [[0, 1, 2, 4095], [], [7, 300, 301, 4000], [5]]
    plan, used, section = _gap_section(rows, k=4)
    idx, got_used, total = _read(plan, used, section)
    assert total == 9 and (got_used == used.numpy()).all()
    for row, values in enumerate(rows):
        assert list(idx[row, : len(values)]) == values
    # 1/64 density in a 64 x 64 block: about 8 bits an index (DisTrO's fixed width is 12).
    generator = torch.Generator().manual_seed(0)
    dense = [sorted(torch.randperm(4096, generator=generator)[:64].tolist()) for _ in range(32)]
    plan, used, section = _gap_section(dense, k=64)
    assert len(section) * 8 / (32 * 64) < 8.5
    assert _read(plan, used, section)[0].tolist() == dense


def _longer_quotients(section: bytes, total: int = 6) -> bytes:
    """One more all-ones byte of quotient padding, its length varint raised to match."""
    at = 1 + (total * section[0] + 7) // 8  # after the Rice parameter and the remainders
    return section[:at] + bytes([section[at] + 1]) + section[at + 1 :] + b"\xff"


@pytest.mark.parametrize("tamper, message", [
    (lambda s: bytes([s[0] + 1]) + s[1:], "Rice parameter|index quotients|truncated"),
    (lambda s: s[:-1] + bytes([s[-1] & 0x7F]), "index quotients"),
    (_longer_quotients, "index quotients are not"),
])
def test_tampered_index_sections_are_refused(tamper, message):
    plan, used, section = _gap_section([[3, 90, 700], [12, 13, 2000]], k=3)
    with pytest.raises(ResultDecodeError, match=message):
        _read(plan, used, tamper(section))


def test_the_lookahead_uses_only_the_result_of_the_round_before():
    starts = []

    def recording_loss(model, batch, micro_batch_size, compute):
        starts.append(next(model.parameters()).detach().clone())
        return causal_lm_loss(model, batch, micro_batch_size, compute)

    model = load_causal_lm(TINY_MODEL, device="cpu")
    trainer = SparseLoCoTrainer(model, CONFIG.model_copy(update={"inner_steps": 1}),
                                ConstantLR(base_lr=1.0, warmup_init_lr=0.0, warmup_steps=0),
                                micro_batch_size=2, loss_fn=recording_loss)
    theta = next(model.parameters())
    data = LocalDataProvider(TRAIN_DATA, 32)
    trainer.train(0, data.get_samples(0, 1))
    own = trainer._own_last[1][0]  # the first parameter's part of round 0's result
    trainer.train(1, data.get_samples(2, 3))  # looks ahead by round 0's result
    lookahead = mean_update([own], trainer.plans[0], theta.dtype, theta.device)
    assert torch.equal(starts[1], theta.detach() - CONFIG.outer_lr * lookahead)
    trainer.train(3, data.get_samples(4, 5))  # sat out round 2: round 1's result is old news
    assert torch.equal(starts[2], theta.detach())
