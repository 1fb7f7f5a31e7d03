import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (speclite.kernels imports it lazily)

import pytest
import torch

from speclite.kernels import int8_gemm, per_token_quant_int8
from speclite.kernels.int8 import int8_gemm_torch, per_token_quant_int8_torch


def make_case(m, n, k, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 4).to(dtype)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    ws = torch.rand(n, 1, generator=gen) * 1e-2 + 1e-3
    return x, w, ws


@pytest.mark.parametrize("m,k", [(1, 64), (5, 200), (3, 4097)])
def test_quantizer_reference_properties(m, k):
    x, _, _ = make_case(m, 8, k, seed=k)
    xq, s = per_token_quant_int8_torch(x)
    assert xq.dtype == torch.int8 and s.shape == (m, 1)
    torch.testing.assert_close(s, x.abs().amax(dim=1, keepdim=True) / 127, rtol=1e-6, atol=0)
    assert torch.equal(xq.abs().amax(dim=1), torch.full((m,), 127, dtype=torch.int8))
    assert ((xq.float() * s - x).abs() <= s / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("m,n,k", [(1, 24, 64), (7, 40, 200), (19, 8, 72)])
def test_gemm_reference_matches_float64(m, n, k):
    x, w, ws = make_case(m, n, k, seed=m * n)
    xq, sx = per_token_quant_int8_torch(x)
    expected = (xq.double() @ w.double().T) * sx.double() * ws.double().T
    torch.testing.assert_close(int8_gemm_torch(x, w, ws).double(), expected, rtol=1e-6, atol=1e-6)


def test_public_functions_on_cpu_take_torch_path():
    x, w, ws = make_case(3, 16, 48, seed=9, dtype=torch.bfloat16)
    y = int8_gemm(x, w, ws)
    assert y.dtype == torch.bfloat16 and torch.equal(y, int8_gemm_torch(x, w, ws))
    xq, s = per_token_quant_int8(x)
    rq, rs = per_token_quant_int8_torch(x)
    assert torch.equal(xq, rq) and torch.equal(s, rs)


@pytest.mark.parametrize("m,k,dtype", [(1, 64, torch.float32), (4, 200, torch.float16), (2, 5000, torch.float32)])
def test_triton_quantizer_matches_reference(m, k, dtype):
    triton_mod = pytest.importorskip("speclite.kernels.int8_triton")
    x, _, _ = make_case(m, 8, k, seed=m + k, dtype=dtype)
    x[0, :3] = torch.tensor([0.5, 1.5, -2.5], dtype=dtype) * x[0].float().abs().max().to(dtype) / 127  # exact ties
    xq, s = triton_mod.per_token_quant_int8(x)
    rq, rs = per_token_quant_int8_torch(x)
    assert torch.equal(s, rs)
    assert torch.equal(xq, rq)


@pytest.mark.parametrize("m,n,k,cfg", [
    (1, 40, 200, (16, 16, 32, 4)),  # decode, split-K, ragged N and K
    (8, 24, 72, (16, 32, 32, 2)),
    (19, 48, 96, (16, 32, 32, 1)),  # ragged M
])
def test_triton_gemm_matches_reference(m, n, k, cfg):
    triton_mod = pytest.importorskip("speclite.kernels.int8_triton")
    from speclite.kernels.tuning import GemmConfig

    x, w, ws = make_case(m, n, k, seed=m * k + n)
    config = GemmConfig(block_m=cfg[0], block_n=cfg[1], block_k=cfg[2], split_k=cfg[3])
    ref = int8_gemm_torch(x, w, ws)
    torch.testing.assert_close(triton_mod.int8_gemm(x, w, ws, config=config), ref, rtol=1e-5, atol=1e-5)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n))  # joins the sum once, whatever the split
    torch.testing.assert_close(triton_mod.int8_gemm(x, w, ws, bias, config=config), ref + bias, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(int8_gemm_torch(x, w, ws, bias), ref + bias, rtol=1e-5, atol=1e-5)
    y16 = triton_mod.int8_gemm(x.half(), w, ws, config=config)
    assert y16.dtype == torch.float16
    torch.testing.assert_close(y16, int8_gemm_torch(x.half(), w, ws), rtol=2e-3, atol=2e-3)
