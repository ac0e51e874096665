"""Wire format v1: round trip, exact sizes, rejection of every kind of bad payload, zero
coefficients left out, fuzzing."""

import contextlib
import itertools
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from client_image.formats.blocks import SparseResult
from client_image.formats.distro_wire import (
    FLAG_ONE_BIT,
    FLAG_SHORT_BLOCKS,
    WIRE_VERSION,
    ResultDecodeError,
    decode_result,
    encode_result,
    index_bits,
)
from client_image.training.distro import compress, plan_model

SHAPES = [("embed", (256, 128)), ("norm", (128,)), ("odd", (96, 48)), ("tiny", (5,))]
PLANS = plan_model(SHAPES, 64, 8)
HEADER = {"step": 7, "trainer_nonce": 3, "batch_start": 40, "batch_end": 47}


def _sparse(seed=0):
    torch.manual_seed(seed)
    return compress([torch.randn(s) for _, s in SHAPES], PLANS)


def _payload(one_bit=True, seed=0):
    return encode_result(_sparse(seed), PLANS, one_bit=one_bit, **HEADER)


def _sparse_with_zeros(seed=0):
    """Zero blocks and zero rows, as a momentum that no gradient touched there has."""
    torch.manual_seed(seed)
    tensors = [torch.randn(s) for _, s in SHAPES]
    tensors[0][:64] = 0  # the embedding's first two 64x64 blocks
    tensors[1][64:] = 0  # the norm's second block
    tensors[3].zero_()
    return compress(tensors, PLANS)


def _assert_canonical(tensor, plan):
    """What any accepted payload decodes to: per block, nonzero values at strictly
    increasing in-block indices, then empty slots (index 0, value 0)."""
    assert tensor.idx.shape == tensor.val.shape == (plan.n_blocks, plan.topk)
    for idx, val in zip(tensor.idx.tolist(), tensor.val.float().tolist(), strict=True):
        used = sum(1 for v in val if v != 0)
        assert all(v != 0 for v in val[:used]) and all(v == 0 for v in val[used:])
        assert idx[used:] == [0] * (plan.topk - used)
        assert all(0 <= i < plan.block_numel for i in idx[:used])
        assert all(a < b for a, b in itertools.pairwise(idx[:used]))


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
    (lambda p: p[:30] + b"\x84\x00" + p[31:], "tensor count: over-long varint"),
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


@pytest.mark.parametrize("one_bit", [True, False])
@pytest.mark.parametrize("indices", [[3, 1, 3], [4, 2, 0], [0, 2, 1], [1, 1, 2], [2, 3, 3]])
def test_decreasing_and_duplicate_indices_are_rejected(indices, one_bit):
    # The unsigned difference of a decreasing pair (1 - 3) wraps around to a huge positive
    # number; the check must compare, or [3, 1, 3] passes.
    plans = plan_model([("v", (5,))], 64, 3)  # one block of 5, k = 3
    sparse = [SparseResult(torch.tensor([indices]), torch.tensor([[0.5, -1.0, 2.0]]))]
    payload = encode_result(sparse, plans, one_bit=one_bit, **HEADER)
    with pytest.raises(ResultDecodeError, match="'v': indices of a block are not strictly increasing"):
        decode_result(payload, plans)


def test_decreasing_indices_inside_a_short_block_are_rejected():
    plans = plan_model([("v", (5,))], 64, 3)
    sparse = [SparseResult(torch.tensor([[3, 1, 0]]), torch.tensor([[0.5, -1.0, 0.0]]))]
    payload = encode_result(sparse, plans, one_bit=True, **HEADER)
    assert payload[5] & FLAG_SHORT_BLOCKS
    with pytest.raises(ResultDecodeError, match="not strictly increasing"):
        decode_result(payload, plans)


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
    with_zeros = encode_result(_sparse_with_zeros(5), PLANS, one_bit=True, **HEADER)
    assert with_zeros == encode_result(_sparse_with_zeros(5), PLANS, one_bit=True, **HEADER)


# Exact bytes, so that a change to the format cannot pass unnoticed. Block of 5 (3-bit
# indices), k = 2; block of 4x4 (4-bit indices), k = 2.
EXACT_PLANS = plan_model([("v", (5,)), ("m", (4, 4))], 64, 2)
EXACT_HEADER = "50534452" "01" "{flags}" "07000000" "03000000" "2800000000000000" "2f00000000000000" "02"


def test_exact_bytes_of_a_full_result():
    sparse = [
        SparseResult(torch.tensor([[1, 4]]), torch.tensor([[-1.5, 2.0]])),
        SparseResult(torch.tensor([[0, 15]]), torch.tensor([[3.0, -0.25]])),
    ]
    one_bit = encode_result(sparse, EXACT_PLANS, one_bit=True, **HEADER)
    # v: 1, 4 as 3-bit -> 0b100_001 = 0x21; signs (-, +) -> 0x01.  m: 0, 15 as 4-bit -> 0xf0; (+, -) -> 0x02.
    assert one_bit.hex() == EXACT_HEADER.format(flags="01") + "010502" "21" "01" "011002" "f0" "02"
    bf16 = encode_result(sparse, EXACT_PLANS, one_bit=False, **HEADER)
    assert bf16.hex() == (
        EXACT_HEADER.format(flags="00") + "010502" "21" "c0bf" "0040" "011002" "f0" "4040" "80be"
    )


def test_exact_bytes_of_a_result_with_zeros():
    # v keeps one coefficient of k = 2 (its -0.0 is a zero); m is all zero.
    sparse = [
        SparseResult(torch.tensor([[3, 0]]), torch.tensor([[-1.5, -0.0]])),
        SparseResult(torch.tensor([[0, 0]]), torch.tensor([[0.0, 0.0]])),
    ]
    payload = encode_result(sparse, EXACT_PLANS, one_bit=True, **HEADER)
    # Per tensor: n_short = 1, then the block's count in 2 bits; v: index 3, sign 1; m: nothing.
    assert payload.hex() == EXACT_HEADER.format(flags="03") + "010502" "01" "01" "03" "01" "011002" "01" "00"
    result = decode_result(payload, EXACT_PLANS)
    assert result.tensors[0].idx.tolist() == [[3, 0]] and result.tensors[0].val.tolist() == [[-1.0, 0.0]]
    assert result.tensors[1].idx.tolist() == [[0, 0]] and result.tensors[1].val.tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("one_bit", [True, False])
def test_zero_coefficients_are_never_sent(one_bit):
    sparse = _sparse_with_zeros()
    payload = encode_result(sparse, PLANS, one_bit=one_bit, **HEADER)
    assert payload[5] == (FLAG_ONE_BIT if one_bit else 0) | FLAG_SHORT_BLOCKS
    result = decode_result(payload, PLANS)
    for plan, sent, got in zip(PLANS, sparse, result.tensors, strict=True):
        _assert_canonical(got, plan)
        assert torch.equal(sent.idx, got.idx)
        expected = torch.sign(sent.val) if one_bit else sent.val.to(torch.bfloat16)
        assert torch.equal(got.val, expected)
    assert not result.tensors[3].val.any()  # "tiny" was all zero: empty, not +1
    assert not result.tensors[0].val[:2].any() and result.tensors[0].val[2:].all()


@pytest.mark.parametrize("one_bit", [True, False])
def test_an_all_zero_result_carries_no_coefficient(one_bit):
    zero = compress([torch.zeros(s) for _, s in SHAPES], PLANS)
    payload = encode_result(zero, PLANS, one_bit=one_bit, **HEADER)
    result = decode_result(payload, PLANS)
    for plan, tensor in zip(PLANS, result.tensors, strict=True):
        _assert_canonical(tensor, plan)
        assert not tensor.val.any()
    # Fixed header, and per tensor its header, n_short and the block counts: nothing else.
    def varint_len(n):
        return max(1, -(-n.bit_length() // 7))

    tensor_bytes = sum(
        varint_len(plan.n_blocks) + varint_len(plan.block_numel) + varint_len(plan.topk)
        + varint_len(plan.n_blocks) + -(-plan.n_blocks * plan.topk.bit_length() // 8)
        for plan in PLANS
    )
    assert len(payload) == 31 + tensor_bytes


def test_zero_and_negative_zero_are_left_out_and_signs_follow_the_sign_bit():
    plans = plan_model([("v", (8,))], 64, 8)  # one block of 8, k = 8: every slot is sent
    values = [0.0, -0.0, 2.0, -3.0, -1e-45, 1e-45, -1e-42, float("-inf")]
    sparse = [SparseResult(torch.arange(8).unsqueeze(0), torch.tensor([values]))]
    one_bit = decode_result(encode_result(sparse, plans, one_bit=True, **HEADER), plans).tensors[0]
    # The smallest subnormals are nonzero: they keep their sign (torch.signbit, as Psyche).
    assert one_bit.idx.tolist() == [[2, 3, 4, 5, 6, 7, 0, 0]]
    assert one_bit.val.tolist() == [[1.0, -1.0, -1.0, 1.0, -1.0, -1.0, 0.0, 0.0]]
    sparse[0].val[0, 7] = -4.0  # a bfloat16 payload must be finite
    bf16 = decode_result(encode_result(sparse, plans, one_bit=False, **HEADER), plans).tensors[0]
    # 1e-45 and 1e-42 round to a bfloat16 zero, so they are zeros on the wire: left out.
    assert bf16.idx.tolist() == [[2, 3, 7, 0, 0, 0, 0, 0]]
    assert bf16.val.float().tolist() == [[2.0, -3.0, -4.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    assert not torch.signbit(bf16.val[0, 3:]).any()  # empty slots are +0, never -0


def _short_result_payload():
    """v (5,), k = 2, one block of which one slot is empty: n_short = 1, count = 1."""
    plans = plan_model([("v", (5,))], 64, 2)
    sparse = [SparseResult(torch.tensor([[3, 0]]), torch.tensor([[-1.5, 0.0]]))]
    payload = encode_result(sparse, plans, one_bit=False, **HEADER)
    assert payload[31:].hex() == "010502" "01" "01" "03" "c0bf"
    return plans, payload


@pytest.mark.parametrize(("tail", "message"), [
    ("010502" "02" "01" "03" "c0bf", "2 short blocks, the tensor has 1"),
    ("010502" "01" "03" "03" "c0bf", "a block claims 3 coefficients, k is 2"),
    ("010502" "01" "02" "03" "c0bf" "c0bf", "0 blocks carry fewer than k = 2, the header says 1"),
    ("010502" "00" "23" "c0bf" "c0bf", "short-blocks flag set but every block carries k"),
    ("010502" "01" "05" "03" "c0bf", "block counts: nonzero padding bits"),
    ("010502" "01" "01" "0b" "c0bf", "indices: nonzero padding bits"),
    ("010502" "01" "01" "03" "0000", "zero value"),
    ("010502" "01" "01" "03" "0080", "zero value"),  # -0.0
    ("010502" "01" "01" "03", "truncated"),
])
def test_bad_short_block_sections_are_rejected(tail, message):
    plans, payload = _short_result_payload()
    with pytest.raises(ResultDecodeError, match=message):
        decode_result(payload[:31] + bytes.fromhex(tail), plans)


def test_nonzero_padding_of_sign_bits_is_rejected():
    payload = bytearray(_payload(one_bit=True))
    payload[-1] |= 0x80  # "tiny": 5 sign bits, so the last byte's top 3 bits are padding
    with pytest.raises(ResultDecodeError, match="'tiny' sign bits: nonzero padding bits"):
        decode_result(bytes(payload), PLANS)


@given(st.binary(max_size=400))
def test_garbage_never_escapes_as_another_exception(data):
    with contextlib.suppress(ResultDecodeError):
        decode_result(data, PLANS)


VALID = _payload(one_bit=True)
VALID_BF16 = _payload(one_bit=False)
VALID_SHORT = encode_result(_sparse_with_zeros(), PLANS, one_bit=True, **HEADER)
VALID_SHORT_BF16 = encode_result(_sparse_with_zeros(), PLANS, one_bit=False, **HEADER)


@given(
    st.sampled_from([VALID, VALID_BF16, VALID_SHORT, VALID_SHORT_BF16]),
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
    # Whatever got through is well-formed for the model and re-encodes to the same bytes:
    # something an honest encoder makes.
    for plan, tensor in zip(PLANS, result.tensors, strict=True):
        _assert_canonical(tensor, plan)
        assert bool(torch.isfinite(tensor.val.float()).all())
    header = {"step": result.step, "trainer_nonce": result.trainer_nonce,
              "batch_start": result.batch_start, "batch_end": result.batch_end}
    assert encode_result(result.tensors, PLANS, one_bit=result.one_bit, **header) == bytes(data)


BLOCK_PLANS = plan_model([("m", (8, 4))], 4, 3)  # two 4x4 blocks, k = 3, 4-bit indices


@given(
    st.lists(st.lists(st.integers(0, 15), min_size=3, max_size=3), min_size=2, max_size=2),
    st.lists(st.lists(st.sampled_from([0.0, -0.0, 1.0, -2.0]), min_size=3, max_size=3),
             min_size=2, max_size=2),
    st.booleans(),
)
def test_any_index_order_decodes_only_if_strictly_increasing(indices, values, one_bit):
    sparse = [SparseResult(torch.tensor(indices), torch.tensor(values))]
    payload = encode_result(sparse, BLOCK_PLANS, one_bit=one_bit, **HEADER)
    # What goes on the wire per block: the indices of its nonzero values, in slot order.
    sent = [
        [i for i, v in zip(idx, val, strict=True) if v != 0]
        for idx, val in zip(indices, values, strict=True)
    ]
    if all(a < b for block in sent for a, b in itertools.pairwise(block)):
        tensor = decode_result(payload, BLOCK_PLANS).tensors[0]
        _assert_canonical(tensor, BLOCK_PLANS[0])
        assert [row[: len(block)] for row, block in zip(tensor.idx.tolist(), sent, strict=True)] == sent
    else:
        with pytest.raises(ResultDecodeError, match="not strictly increasing"):
            decode_result(payload, BLOCK_PLANS)
