"""Wire format v1: round trip, exact sizes, rejection of every kind of bad payload, fuzzing."""

import contextlib
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from client_image.training.distro import compress, plan_model
from client_image.training.wire import (
    WIRE_VERSION,
    ResultDecodeError,
    decode_result,
    encode_result,
    index_bits,
)

SHAPES = [("embed", (256, 128)), ("norm", (128,)), ("odd", (96, 48)), ("tiny", (5,))]
PLANS = plan_model(SHAPES, 64, 8)
HEADER = {"step": 7, "trainer_nonce": 3, "batch_start": 40, "batch_end": 47}


def _sparse(seed=0):
    torch.manual_seed(seed)
    return compress([torch.randn(s) for _, s in SHAPES], PLANS)


def _payload(one_bit=True, seed=0):
    return encode_result(_sparse(seed), PLANS, one_bit=one_bit, **HEADER)


def test_index_bits_are_what_a_block_needs():
    assert index_bits(4096) == 12
    assert index_bits(64) == 6
    assert index_bits(48 * 48) == 12
    assert index_bits(5) == 3
    assert index_bits(1) == 1


@pytest.mark.parametrize("one_bit", [True, False])
def test_round_trip_keeps_indices_and_values(one_bit):
    sparse = _sparse()
    result = decode_result(encode_result(sparse, PLANS, one_bit=one_bit, **HEADER), PLANS)
    assert (result.step, result.trainer_nonce, result.batch_start, result.batch_end) == (7, 3, 40, 47)
    assert result.one_bit is one_bit
    for sent, got in zip(sparse, result.tensors, strict=True):
        assert torch.equal(sent.idx, got.idx)
        if one_bit:
            assert torch.equal(got.val, torch.where(sent.val < 0, -1.0, 1.0))
        else:
            assert torch.equal(got.val, sent.val.to(torch.bfloat16))


def test_payload_size_is_the_bit_budget_plus_small_headers():
    payload = _payload(one_bit=True)
    body = 0
    for plan in PLANS:
        n = plan.n_blocks * plan.topk
        body += -(-n * index_bits(plan.block_numel) // 8) + -(-n // 8)
    headers = len(payload) - body
    assert headers <= 30 + 1 + 5 * len(PLANS)
    # The 256x128 embedding: 8 blocks of 64x64, 8 x (12 + 1) bits each = 104 bytes.
    assert PLANS[0].n_blocks == 8 and body >= 104


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda p: p[:-1], "truncated"),
    (lambda p: p + b"\0", "trailing"),
    (lambda p: b"XXXX" + p[4:], "magic"),
    (lambda p: p[:4] + bytes([WIRE_VERSION + 1]) + p[5:], "version"),
    (lambda p: p[:5] + b"\x80" + p[6:], "flags"),
    (lambda p: p[:6] + struct.pack("<IIQQ", 1, 1, 9, 2) + p[30:], "start 9 > end 2"),
    (lambda p: p[:30] + b"\x05" + p[31:], "tensors, the model has 4"),
    (lambda p: p[:31] + b"\x09" + p[32:], "'embed'"),
    (lambda p: b"", "truncated"),
])
def test_bad_payloads_are_rejected_with_a_clear_error(mutate, message):
    with pytest.raises(ResultDecodeError, match=message):
        decode_result(mutate(_payload()), PLANS)


def test_index_outside_the_block_is_rejected():
    plans = plan_model([("v", (5,))], 64, 8)  # one block of 5, k = 5, 3-bit indices
    sparse = compress([torch.randn(5)], plans)
    sparse[0].idx = torch.tensor([[0, 1, 2, 3, 7]])
    with pytest.raises(ResultDecodeError, match="index 7 outside a block of 5"):
        decode_result(encode_result(sparse, plans, one_bit=True, **HEADER), plans)


def test_duplicate_indices_are_rejected():
    sparse = _sparse()
    sparse[0].idx[0, 1] = sparse[0].idx[0, 0]
    with pytest.raises(ResultDecodeError, match="strictly increasing"):
        decode_result(encode_result(sparse, PLANS, one_bit=True, **HEADER), PLANS)


def test_non_finite_values_are_rejected():
    sparse = _sparse()
    sparse[1].val[0, 0] = float("nan")
    with pytest.raises(ResultDecodeError, match="non-finite"):
        decode_result(encode_result(sparse, PLANS, one_bit=False, **HEADER), PLANS)


def test_payload_for_another_model_is_rejected():
    other = plan_model([("embed", (256, 64)), *SHAPES[1:]], 64, 8)
    with pytest.raises(ResultDecodeError, match="the model expects"):
        decode_result(_payload(), other)


def test_encoding_is_deterministic():
    assert _payload(seed=5) == _payload(seed=5)
    assert _payload(seed=5) != _payload(seed=6)


@given(st.binary(max_size=400))
def test_garbage_never_escapes_as_another_exception(data):
    with contextlib.suppress(ResultDecodeError):
        decode_result(data, PLANS)


VALID = _payload(one_bit=True)
VALID_BF16 = _payload(one_bit=False)


@given(
    st.sampled_from([VALID, VALID_BF16]),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, 40),
)
def test_mutated_payloads_decode_validly_or_raise_decode_error(payload, flips, cut):
    data = bytearray(payload)
    for position, value in flips:
        data[position % len(data)] = value
    data = data[: len(data) - cut]
    try:
        result = decode_result(bytes(data), PLANS)
    except ResultDecodeError:
        return
    # Whatever got through is well-formed for the model.
    for plan, tensor in zip(PLANS, result.tensors, strict=True):
        assert tensor.idx.shape == (plan.n_blocks, plan.topk)
        assert int(tensor.idx.max()) < plan.block_numel
        assert bool(torch.isfinite(tensor.val.float()).all())
