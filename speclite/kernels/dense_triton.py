"""Triton GEMM of 16- and 32-bit weights for decode and verification rows (M <= tuning.GEMV_ROWS).

torch's matmul (cuBLAS) chooses its kernel by the row count, a GEMV for one row and GEMMs with
other K splits for more, so a row's sum over K may round differently in a one-row step than in a
k + 1-row verification, and greedy speculation then part from plain decoding. This kernel keeps
one launch config per shape for every such row count, as the quantized GEMMs do: each row is its
one-row call's, bit for bit. Split-K over the GPU for one row; the bias (when given) joins the
first split's partial, so it is added once, in the same place at every row count.
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from . import tuning
from .triton_common import dot_precision, gemm_out_buffers, gemm_tile, store_split, with_bias


@triton.jit
def _dense_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wn,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n, first, last = gemm_tile(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kt in range(first, last):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0)
        # The weight's rows as stored (K contiguous: whole lines per load), turned for the dot.
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                    other=0.0)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
    acc = with_bias(acc, b_ptr, offs_n, mask_n, HAS_BIAS)
    store_split(out_ptr, part_ptr, count_ptr, acc, M, N, offs_m, offs_n, mask_m, mask_n)


def dense_gemm(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               config: Optional[tuning.GemmConfig] = None) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T (+ bias) in x's dtype; weight of x's dtype, rows strided, K contiguous."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    n = weight.shape[0]

    def run(cfg: tuning.GemmConfig) -> torch.Tensor:
        grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), cfg.split_k)
        out, parts, counts = gemm_out_buffers(m, n, cfg.split_k, x.dtype, x.device, grid[0] * grid[1])
        _dense_kernel[grid](
            x, weight, weight if bias is None else bias, out, parts, counts, m, n, k, x.stride(0), weight.stride(0),
            HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            DOT_PRECISION=dot_precision(x.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return out

    if config is None:
        key = ("dense", tuning.m_bucket(m), n, k, x.dtype, bias is not None)
        config = tuning.pick(key, tuning.gemm_candidates(m, lambda bk: triton.cdiv(k, bk)), run, x.device)
    return run(config)
