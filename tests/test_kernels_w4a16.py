import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (speclite.kernels imports it lazily)

import pytest
import torch

from speclite.kernels import w4a16_gemm
from speclite.kernels.w4a16 import w4a16_gemm_torch


def pack_rows(q):
    """int [K, N] nibbles -> int32 [K//8, N], 8 consecutive k per word, lowest bits first."""
    k, n = q.shape
    words = torch.zeros(k // 8, n, dtype=torch.int64)
    for j in range(8):
        words |= q[j::8].long() << (4 * j)
    return (words - (words >= 2**31).long() * 2**32).to(torch.int32)  # reinterpret as signed int32


def pack_cols(z):
    g, n = z.shape
    words = torch.zeros(g, n // 8, dtype=torch.int64)
    for j in range(8):
        words |= z[:, j::8].long() << (4 * j)
    return (words - (words >= 2**31).long() * 2**32).to(torch.int32)


def make_case(m, k, n, group_size, act_order, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    groups = -(-k // group_size)
    q = torch.randint(0, 16, (k, n), generator=gen)
    zeros = torch.randint(0, 16, (groups, n), generator=gen)
    scales = (torch.rand(groups, n, generator=gen) * 0.02 + 0.005).to(torch.float16)
    if act_order == "plain":  # checkpoints without desc_act still ship g_idx = k // group_size
        g_idx = (torch.arange(k) // group_size).to(torch.int32)
    elif act_order:  # desc_act checkpoints: channel k belongs to a shuffled group
        g_idx = (torch.randperm(k, generator=gen) // group_size).to(torch.int32)
    else:
        g_idx = None
    x = (torch.randn(m, k, generator=gen) * 0.5).to(dtype)
    return x, q, zeros, scales, g_idx


def plain_reference(x, q, zeros, scales, g_idx, group_size):
    """Format definition, float64: w[k, n] = (q[k, n] - zero[g[k], n]) * scale[g[k], n]."""
    k = q.shape[0]
    g = g_idx.long() if g_idx is not None else torch.arange(k) // group_size
    w = (q - zeros[g]).double() * scales.double()[g]
    return x.double() @ w


@pytest.mark.parametrize("m,k,n,group_size,act_order", [
    (1, 64, 16, 32, False), (3, 200, 40, 64, False), (7, 96, 24, 32, True), (1, 136, 8, 128, True),
])
def test_torch_reference_matches_format_definition(m, k, n, group_size, act_order):
    x, q, zeros, scales, g_idx = make_case(m, k, n, group_size, act_order, torch.float32, seed=m * 1000 + k)
    y = w4a16_gemm_torch(x, pack_rows(q), pack_cols(zeros), scales, g_idx, group_size)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), plain_reference(x, q, zeros, scales, g_idx, group_size), rtol=1e-5, atol=1e-5)


def test_public_function_on_cpu_takes_torch_path():
    x, q, zeros, scales, g_idx = make_case(2, 64, 16, 32, False, torch.bfloat16, seed=5)
    y = w4a16_gemm(x, pack_rows(q), pack_cols(zeros), scales, g_idx, 32)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 16)
    torch.testing.assert_close(y, w4a16_gemm_torch(x, pack_rows(q), pack_cols(zeros), scales, g_idx, 32), rtol=0, atol=0)


# Triton under the interpreter. fp16/fp32 activations only: the interpreter's bf16 tl.dot is wrong.
@pytest.mark.parametrize("m,k,n,group_size,act_order,dtype,cfg", [
    # decode/verify shapes, split-K, ragged K and N, one group per tile
    (1, 200, 40, 32, False, torch.float16, (16, 16, 32, 3)),
    (5, 136, 24, 64, False, torch.float32, (16, 16, 32, 2)),
    # tile spanning several groups, and act-order gathers
    (16, 72, 48, 16, False, torch.float16, (16, 32, 32, 1)),
    (4, 104, 16, 32, True, torch.float16, (16, 16, 32, 4)),
    # prefill-like tiling with ragged M
    (19, 96, 40, 32, True, torch.float32, (16, 32, 32, 1)),
    (2, 80, 16, 32, "plain", torch.float16, (16, 16, 32, 2)),  # trivial g_idx takes the per-tile scale path
])
def test_triton_matches_reference(m, k, n, group_size, act_order, dtype, cfg):
    triton_mod = pytest.importorskip("speclite.kernels.w4a16_triton")
    from speclite.kernels.tuning import GemmConfig

    x, q, zeros, scales, g_idx = make_case(m, k, n, group_size, act_order, dtype, seed=m + k + n)
    args = (x, pack_rows(q), pack_cols(zeros), scales, g_idx, group_size)
    config = GemmConfig(block_m=cfg[0], block_n=cfg[1], block_k=cfg[2], split_k=cfg[3])
    y = triton_mod.w4a16_gemm(*args, config=config)
    ref = w4a16_gemm_torch(*args)
    assert y.dtype == dtype and y.shape == (m, n)
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(y, ref, rtol=tol, atol=tol)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)  # joins the sum once, whatever the split
    yb = triton_mod.w4a16_gemm(*args, bias, config=config)
    torch.testing.assert_close(yb, w4a16_gemm_torch(*args, bias), rtol=tol, atol=tol)
    torch.testing.assert_close(yb.float(), ref.float() + bias.float(), rtol=2 * tol, atol=2 * tol)


@pytest.mark.parametrize("m,k,n,dtype,split", [
    (1, 384, 40, torch.float16, 3),  # whole tiles, one per split
    (5, 328, 24, torch.float32, 2),  # a ragged last tile (41 packed rows: 16 + 16 + 9)
    (3, 256, 16, torch.float16, 1),  # two tiles summed in one program
])
def test_triton_tiles_of_whole_packed_words_match_the_format(m, k, n, dtype, split):
    """BLOCK_K 128 inside a 128-channel group: each packed word loaded once, its nibbles as eight dots,
    the integers (q - zero) multiplied and the group's scale applied to the tile's sum: the format's
    numbers (float64), and the other tile shapes' within rounding."""
    triton_mod = pytest.importorskip("speclite.kernels.w4a16_triton")
    from speclite.kernels.tuning import GemmConfig

    x, q, zeros, scales, g_idx = make_case(m, k, n, 128, False, dtype, seed=m * k + n)
    args = (x, pack_rows(q), pack_cols(zeros), scales, g_idx, 128)
    y = triton_mod.w4a16_gemm(*args, config=GemmConfig(16, 16, 128, split))
    assert y.dtype == dtype and y.shape == (m, n)
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(y.double(), plain_reference(x, q, zeros, scales, g_idx, 128), rtol=tol, atol=tol)
    torch.testing.assert_close(y, triton_mod.w4a16_gemm(*args, config=GemmConfig(16, 16, 64, 1)), rtol=tol, atol=tol)


def test_triton_takes_column_ranges_of_wider_packed_tensors():
    """q, k and v joined (decoder.join_projections): each part's qweight, qzeros and scales are column
    views of one tensor, rows strided by the whole width; the parts' products and the joint one equal
    each part on its own tensors, bit for bit."""
    triton_mod = pytest.importorskip("speclite.kernels.w4a16_triton")
    from speclite.kernels.tuning import GemmConfig

    widths, k, gen = (32, 16, 24), 256, torch.Generator().manual_seed(11)
    parts = [make_case(3, k, n, 128, False, torch.float16, seed=n)[1:4] for n in widths]
    x = (torch.randn(3, k, generator=gen) * 0.5).to(torch.float16)
    own = [(pack_rows(q), pack_cols(z), s) for q, z, s in parts]
    joint = [torch.cat(ts, dim=1) for ts in zip(*own)]
    config = GemmConfig(16, 16, 128, 2)
    alone = [triton_mod.w4a16_gemm(x, *t, None, 128, config=config) for t in own]
    col = 0
    for n, mine in zip(widths, alone):
        views = (joint[0][:, col:col + n], joint[1][:, col // 8:(col + n) // 8], joint[2][:, col:col + n])
        assert not views[0].is_contiguous()
        assert torch.equal(triton_mod.w4a16_gemm(x, *views, None, 128, config=config), mine)
        col += n
    assert torch.equal(triton_mod.w4a16_gemm(x, *joint, None, 128, config=config), torch.cat(alone, dim=1))
