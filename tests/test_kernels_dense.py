"""The Triton GEMM for decode and verification rows of 16/32-bit weights (kernels.dense_triton) under
Triton's interpreter: float64's numbers within rounding, each row its one-row call's bit for bit, the
bias added once whatever the split, and kernels.linear sending only decode / verification rows to it.
tests/test_cuda.py runs it compiled. (The interpreter's bf16 dot is wrong: fp16 and fp32 here.)"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (speclite.kernels imports it lazily)

import pytest
import torch

pytest.importorskip("triton")

from speclite.kernels import dense, dense_triton, tuning  # noqa: E402
from speclite.kernels.tuning import GemmConfig  # noqa: E402


@pytest.fixture(autouse=True)
def dot_row_by_row(monkeypatch):
    """The interpreter's tl.dot is numpy's matmul: float32 goes to OpenBLAS, whose SGEMM sums a row in
    another order depending on where it sits in the tile on some CPUs (its Haswell kernels on AMD Zen 5:
    6 of 16 rows of a 16 x 64 @ 64 x 16 product differ from the same row moved to the top). A GPU's
    dot computes each output the same way wherever its row sits; so does this one, a row at a time,
    so the kernel's own tiling, masking and split are what the row-alone check below checks."""
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.ndim != 2 or a.data.dtype != np.float32:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        rows = [np.matmul(a.data[i:i + 1], b.data, dtype=d.data.dtype) for i in range(a.data.shape[0])]
        return interpreter.TensorHandle(np.concatenate(rows) + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)


@pytest.mark.parametrize("m,n,k,dtype,cfg,bias", [
    (1, 40, 200, torch.float16, (16, 16, 64, 2), False),  # split-K, ragged N and K
    (5, 48, 128, torch.float32, (16, 32, 32, 4), True),  # the bias with four splits
    (9, 24, 96, torch.float16, (16, 16, 32, 1), True),
    (17, 16, 64, torch.float32, (16, 16, 64, 1), False),  # two row tiles
])
def test_dense_matches_float64_and_rows_stand_alone(m, n, k, dtype, cfg, bias):
    gen = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) * 0.1).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    config = GemmConfig(*cfg)
    y = dense_triton.dense_gemm(x, w, b, config)
    exact = x.double() @ w.double().T + (0 if b is None else b.double())
    assert y.dtype == dtype and y.shape == (m, n)
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(y.double(), exact, rtol=tol, atol=tol)
    alone = torch.cat([dense_triton.dense_gemm(x[i:i + 1], w, b, config) for i in range(m)])
    assert torch.equal(alone, y)


def test_rows_of_a_wider_weight():
    """A weight's row range (decoder.join_projections' views): rows strided, K contiguous."""
    gen = torch.Generator().manual_seed(3)
    x, whole = torch.randn(3, 64, generator=gen), torch.randn(96, 64, generator=gen)
    part = whole[32:80]
    y = dense_triton.dense_gemm(x, part, None, GemmConfig(16, 16, 32, 2))
    torch.testing.assert_close(y, x @ part.T, rtol=1e-5, atol=1e-5)


def test_linear_sends_decode_and_verification_rows_to_the_triton_gemm(monkeypatch):
    """kernels.linear on a GPU (use_triton): up to GEMV_ROWS rows, any leading shape, through the
    Triton GEMM; a prefill's rows, or a weight of another dtype, through torch."""
    calls = []
    monkeypatch.setattr(dense, "use_triton", lambda t: True)
    monkeypatch.setattr(dense_triton, "dense_gemm", lambda x, w, b: calls.append(x.shape) or x @ w.T)
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(8, 16, generator=gen)
    assert dense.linear(torch.randn(2, 3, 16, generator=gen), w).shape == (2, 3, 8) and calls == [(6, 16)]
    assert dense.linear(torch.randn(16, generator=gen), w).shape == (8,) and calls[-1] == (1, 16)
    # (3-D inputs: the CPU's own kernels take 2-D CPU tensors before this choice.)
    assert dense.linear(torch.randn(1, tuning.GEMV_ROWS + 1, 16, generator=gen), w).shape == (1, tuning.GEMV_ROWS + 1, 8)
    assert dense.linear(torch.randn(1, 2, 16, generator=gen).half(), w).dtype == torch.float16
    assert len(calls) == 2


def test_split_k_sums_in_the_last_split_and_leaves_its_counts_at_zero():
    """Split-K without a reduction kernel: the tile's last split to arrive sums the partials (float64's
    numbers within rounding); every count is zero after each call, so the next call (or a CUDA graph's
    replay) starts afresh, and repeated calls agree bit for bit."""
    from speclite.kernels import triton_common

    gen = torch.Generator().manual_seed(9)
    x, w = torch.randn(3, 256, generator=gen), torch.randn(40, 256, generator=gen) * 0.1
    first = dense_triton.dense_gemm(x, w, None, GemmConfig(16, 16, 32, 4))
    torch.testing.assert_close(first.double(), x.double() @ w.double().T, rtol=1e-5, atol=1e-5)
    assert not triton_common._tile_counts[x.device].any()
    assert torch.equal(dense_triton.dense_gemm(x, w, None, GemmConfig(16, 16, 32, 4)), first)
