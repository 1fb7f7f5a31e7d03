"""Triton W8A8: per-token int8 quantizer and int8 x int8 -> int32 GEMM with both scales in the epilogue."""

from typing import Optional

import torch
import triton
import triton.language as tl

from . import tuning
from .int8 import INT8_SCALE_EPS
from .triton_common import gemm_out_buffers, gemm_tile, int8_row_scale, store_split, to_int8, with_bias


@triton.jit
def _token_quant_int8_kernel(x_ptr, xq_ptr, s_ptr, K, stride_xm, BLOCK: tl.constexpr, EPS: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    absmax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        absmax = tl.maximum(absmax, tl.abs(tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)))
    scale = int8_row_scale(tl.max(absmax, axis=0), EPS)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        tl.store(xq_ptr + row * K + offs, to_int8(x, scale).to(tl.int8), mask=offs < K)
    tl.store(s_ptr + row, scale)


def per_token_quant_int8(x: torch.Tensor):
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    xq = torch.empty((m, k), dtype=torch.int8, device=x.device)
    scales = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    _token_quant_int8_kernel[(m,)](x, xq, scales, k, x.stride(0), BLOCK=min(4096, triton.next_power_of_2(k)),
                                   EPS=INT8_SCALE_EPS)
    return xq, scales


@triton.jit
def _int8_gemm_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, b_ptr, out_ptr, part_ptr, count_ptr, M, N, K,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n, first, last = gemm_tile(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
    for kt in range(first, last):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        a = tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0)
        b = tl.load(w_ptr + offs_n[None, :] * K + offs_k[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)  # Triton 3.6 compiles int8 dots to int32 only when told

    a_scale = tl.load(as_ptr + offs_m, mask=mask_m, other=0.0)
    w_scale = tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0)
    y = with_bias(acc.to(tl.float32) * a_scale[:, None] * w_scale[None, :], b_ptr, offs_n, mask_n, HAS_BIAS)
    store_split(out_ptr, part_ptr, count_ptr, y, M, N, offs_m, offs_n, mask_m, mask_n)


def int8_gemm_quantized(xq: torch.Tensor, x_scales: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                        out_dtype: torch.dtype, bias: Optional[torch.Tensor] = None,
                        config: Optional[tuning.GemmConfig] = None) -> torch.Tensor:
    """The GEMM alone (+ bias), on activations already quantized per token."""
    m, k = xq.shape
    n = weight.shape[0]
    w_scale = weight_scale.float().reshape(-1).contiguous()

    def run(cfg: tuning.GemmConfig) -> torch.Tensor:
        grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), cfg.split_k)
        out, parts, counts = gemm_out_buffers(m, n, cfg.split_k, out_dtype, xq.device, grid[0] * grid[1])
        _int8_gemm_kernel[grid](xq, x_scales, weight, w_scale, w_scale if bias is None else bias, out, parts, counts,
                                m, n, k, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m,
                                BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return out

    if config is None:
        key = ("int8", tuning.m_bucket(m), n, k, out_dtype, bias is not None)
        config = tuning.pick(key, tuning.gemm_candidates(m, lambda bk: triton.cdiv(k, bk)), run, xq.device)
    return run(config)


def int8_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor] = None,
              config: Optional[tuning.GemmConfig] = None) -> torch.Tensor:
    xq, xs = per_token_quant_int8(x)
    return int8_gemm_quantized(xq, xs, weight, weight_scale, x.dtype, bias, config)
