"""DCT basis, block layout, top-k and aggregation of client_image.training.distro."""

import math

import pytest
import torch

from client_image.formats.blocks import SparseResult
from client_image.training.distro import (
    chunk_size,
    compress,
    dct_basis,
    dct_blocks,
    decompress,
    from_blocks,
    idct_blocks,
    plan_parameter,
    scatter_mean,
    sparse_idct_blocks,
    to_blocks,
    topk_blocks,
)


@pytest.mark.parametrize(("dim", "chunk", "expected"), [
    (128, 64, 64), (384, 64, 64), (96, 64, 48), (50257, 64, 29), (67, 64, 1), (10, 64, 10), (64, 64, 64),
])
def test_chunk_is_largest_divisor_up_to_the_configured_chunk(dim, chunk, expected):
    assert chunk_size(dim, chunk) == expected


@pytest.mark.parametrize("size", [1, 2, 16, 48, 64])
def test_dct_basis_is_orthonormal_and_matches_dct_ii(size):
    f = dct_basis(size, torch.float64)
    assert torch.allclose(f.T @ f, torch.eye(size, dtype=torch.float64), atol=1e-12)
    # Column k is frequency k: sigma_k cos(pi (2i+1) k / 2c).
    i = 0
    k = size - 1
    sigma = math.sqrt((1 if k == 0 else 2) / size)
    assert f[i, k].item() == pytest.approx(sigma * math.cos(math.pi * (2 * i + 1) * k / (2 * size)))


def test_constant_block_has_only_the_dc_coefficient():
    blocks = torch.full((3, 8, 4), 2.0, dtype=torch.float64)
    e = dct_blocks(blocks)
    assert e[:, 0, 0] == pytest.approx(torch.full((3,), 2.0 * math.sqrt(32)).tolist())
    e[:, 0, 0] = 0
    assert e.abs().max() < 1e-12


def test_dct_round_trip_and_energy_preservation():
    torch.manual_seed(0)
    blocks = torch.randn(5, 16, 8, dtype=torch.float64)
    e = dct_blocks(blocks)
    assert torch.allclose(idct_blocks(e), blocks, atol=1e-12)
    assert e.norm().item() == pytest.approx(blocks.norm().item())  # Parseval


@pytest.mark.parametrize("shape", [(128, 384), (384, 128), (2, 3, 96, 64), (128,), (7,), ()])
def test_blocks_layout_round_trip(shape):
    plan = plan_parameter("p", shape, 64, 8)
    x = torch.randn(shape)
    blocks = to_blocks(x, plan)
    assert blocks.shape == (plan.n_blocks, plan.row_chunk, plan.col_chunk)
    assert torch.equal(from_blocks(blocks, plan), x)


def test_block_holds_a_contiguous_tile():
    plan = plan_parameter("p", (128, 128), 64, 8)
    x = torch.arange(128 * 128.0).reshape(128, 128)
    blocks = to_blocks(x, plan)
    assert torch.equal(blocks[1], x[:64, 64:])  # block (y=0, x=1)
    assert torch.equal(blocks[2], x[64:, :64])


def test_topk_picks_largest_magnitudes_in_ascending_index_order():
    e = torch.zeros(2, 2, 4)
    e[0, 0, 3], e[0, 1, 0], e[0, 1, 2] = -5.0, 4.0, 0.5
    e[1, 1, 3] = 1.0
    idx, val = topk_blocks(e, 2)
    assert idx[0].tolist() == [3, 4]
    assert val[0].tolist() == [-5.0, 4.0]
    # One nonzero coefficient: it, then an empty slot (never one of the zeros).
    assert idx[1].tolist() == [7, 0]
    assert val[1].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_never_selects_a_zero_and_is_canonical(dtype):
    e = torch.zeros(3, 4, 4, dtype=dtype)
    e[1, 0, 1], e[1, 3, 3] = -0.0, 2.0  # -0.0 is a zero too
    e[2] = -0.0
    idx, val = topk_blocks(e, 3)
    assert idx.tolist() == [[0, 0, 0], [15, 0, 0], [0, 0, 0]]
    assert val.float().tolist() == [[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert not torch.signbit(val[val == 0]).any()  # empty slots hold +0.0
    # Zeros placed differently (so topk may pick other ones) give the same result.
    flipped = torch.flip(e, dims=[1, 2])
    flipped[1] = e[1]
    assert all(torch.equal(a, b) for a, b in zip(topk_blocks(flipped, 3), (idx, val), strict=True))


def test_full_k_compression_is_lossless():
    torch.manual_seed(1)
    shapes = [(128, 64), (64,), (96, 32)]
    plans = [plan_parameter(f"p{i}", s, 64, 10**6) for i, s in enumerate(shapes)]
    tensors = [torch.randn(s, dtype=torch.float64) for s in shapes]
    restored = decompress([compress(tensors, plans)], plans, torch.float64, "cpu")
    for x, y in zip(tensors, restored, strict=True):
        assert torch.allclose(x, y, atol=1e-10)


def test_scatter_mean_averages_only_over_senders():
    idx_a, val_a = torch.tensor([[0, 2]]), torch.tensor([[1.0, 4.0]])
    idx_b, val_b = torch.tensor([[2, 3]]), torch.tensor([[-2.0, 6.0]])
    assert scatter_mean([idx_a, idx_b], [val_a, val_b], 4).tolist() == [[1.0, 0.0, 1.0, 6.0]]
    # An empty slot (value 0) is no sender: it neither adds nor dilutes.
    idx_c, val_c = torch.tensor([[2, 0]]), torch.tensor([[0.0, 0.0]])
    got = scatter_mean([idx_a, idx_b, idx_c], [val_a, val_b, val_c], 4)
    assert got.tolist() == [[1.0, 0.0, 1.0, 6.0]]


@pytest.mark.parametrize("peers", [1, 3])
def test_an_all_zero_peer_leaves_the_aggregate_unchanged(peers):
    torch.manual_seed(4)
    plans = [plan_parameter("w", (128, 64), 64, 8), plan_parameter("v", (64,), 64, 8)]
    results = [compress([torch.randn(p.shape, dtype=torch.float64) for p in plans], plans) for _ in range(peers)]
    zero = compress([torch.zeros(p.shape, dtype=torch.float64) for p in plans], plans)
    assert all(not r.val.any() for r in zero)
    alone = decompress(results, plans, torch.float64, "cpu")
    joined = decompress([*results, zero], plans, torch.float64, "cpu")
    # Equal up to the matmul's summation order; a dilution would halve coefficients.
    assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(alone, joined, strict=True))
    assert all(not t.any() for t in decompress([zero], plans, torch.float64, "cpu"))


@pytest.mark.parametrize("peers", [1, 3, 20])
def test_sparse_and_dense_inverse_paths_agree(peers):
    torch.manual_seed(2)
    plans = [plan_parameter("w", (128, 128), 64, 8)]
    results = [compress([torch.randn(128, 128, dtype=torch.float64)], plans) for _ in range(peers)]
    got = decompress(results, plans, torch.float64, "cpu")[0]
    # Reference: dense scatter-mean then dense inverse DCT.
    g = scatter_mean([r[0].idx for r in results], [r[0].val for r in results], 4096)
    expected = from_blocks(idct_blocks(g.reshape(-1, 64, 64)), plans[0])
    assert torch.allclose(got, expected, atol=1e-10)
    idx = torch.tensor([[5, 64]])
    single = sparse_idct_blocks(idx, torch.tensor([[1.0]]).double().expand(1, 2), 64, 64)
    dense = torch.zeros(1, 4096, dtype=torch.float64)
    dense[0, 5] = dense[0, 64] = 1
    assert torch.allclose(single, idct_blocks(dense.reshape(1, 64, 64)), atol=1e-12)


def test_compress_keeps_most_energy_of_a_smooth_update():
    # A low-frequency update is what the DCT concentrates: top-8 of 4096 keeps nearly all of it.
    plans = [plan_parameter("w", (64, 64), 64, 8)]
    i = torch.arange(64, dtype=torch.float64)
    smooth = torch.outer(torch.cos(math.pi * (2 * i + 1) / 128), torch.ones(64, dtype=torch.float64))
    restored = decompress([compress([smooth], plans)], plans, torch.float64, "cpu")[0]
    assert torch.allclose(restored, smooth, atol=1e-10)
    assert isinstance(compress([smooth], plans)[0], SparseResult)
