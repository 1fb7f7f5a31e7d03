"""Triton FP8 block GEMM: fp8 x fp8 tl.dot per K tile, block scales applied to each tile's partial.

Two launches: the activation quantizer, then the GEMM (split-K GEMV-shaped for decode and
verification rows, tuning.GEMV_ROWS, tiled for prefill; tuned per shape). BLOCK_K divides the
128-channel scale group so every K tile has one activation scale per row and one weight scale per
output block.
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from . import tuning
from .fp8_block import FP8_MAX, FP8_SCALE_EPS
from .triton_common import fp8_group_scale, gemm_out_buffers, gemm_tile, store_split, to_e4m3, with_bias


@triton.jit
def _group_quant_fp8_kernel(x_ptr, xq_ptr, s_ptr, K, stride_xm, groups,
                            GROUP_SIZE: tl.constexpr, BLOCK: tl.constexpr, FP8_MAX: tl.constexpr, EPS: tl.constexpr):
    row = tl.program_id(0)
    grp = tl.program_id(1)
    offs = grp * GROUP_SIZE + tl.arange(0, BLOCK)
    mask = (tl.arange(0, BLOCK) < GROUP_SIZE) & (offs < K)
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    scale = fp8_group_scale(tl.max(tl.abs(x), axis=0), FP8_MAX, EPS)
    tl.store(xq_ptr + row * K + offs, to_e4m3(x, scale, FP8_MAX).to(xq_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * groups + grp, scale)


def per_token_group_quant_fp8(x: torch.Tensor, group_size: int = 128):
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    groups = triton.cdiv(k, group_size)
    xq = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    _group_quant_fp8_kernel[(m, groups)](x, xq, scales, k, x.stride(0), groups, GROUP_SIZE=group_size,
                                         BLOCK=triton.next_power_of_2(group_size), FP8_MAX=FP8_MAX, EPS=FP8_SCALE_EPS)
    return xq, scales


@triton.jit
def _fp8_block_gemm_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, a_groups, w_kblocks,
    GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n, first, last = gemm_tile(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    w_scale_rows = ws_ptr + (offs_n // GROUP_N) * w_kblocks

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kt in range(first, last):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        # other=0.0 on fp8 loads: an integer fill value is not converted correctly.
        a = tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(w_ptr + offs_n[None, :] * K + offs_k[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        kg = (kt * BLOCK_K) // GROUP_K
        a_scale = tl.load(as_ptr + offs_m * a_groups + kg, mask=mask_m, other=0.0)
        w_scale = tl.load(w_scale_rows + kg, mask=mask_n, other=0.0)
        acc += tl.dot(a, b) * a_scale[:, None] * w_scale[None, :]

    acc = with_bias(acc, b_ptr, offs_n, mask_n, HAS_BIAS)
    store_split(out_ptr, part_ptr, count_ptr, acc, M, N, offs_m, offs_n, mask_m, mask_n)


def fp8_block_gemm_quantized(xq: torch.Tensor, x_scales: torch.Tensor, weight: torch.Tensor,
                             weight_scale_inv: torch.Tensor, block_size, out_dtype: torch.dtype,
                             bias: Optional[torch.Tensor] = None,
                             config: Optional[tuning.GemmConfig] = None) -> torch.Tensor:
    """The GEMM alone (+ bias), on activations already quantized per token group (block_size[1] wide)."""
    m, k = xq.shape
    n = weight.shape[0]
    group_n, group_k = block_size

    def run(cfg: tuning.GemmConfig) -> torch.Tensor:
        grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), cfg.split_k)
        out, parts, counts = gemm_out_buffers(m, n, cfg.split_k, out_dtype, xq.device, grid[0] * grid[1])
        _fp8_block_gemm_kernel[grid](
            xq, x_scales, weight, weight_scale_inv, weight_scale_inv if bias is None else bias, out, parts, counts,
            m, n, k, x_scales.shape[1], weight_scale_inv.shape[1],
            GROUP_N=group_n, GROUP_K=group_k, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return out

    if config is None:
        key = ("fp8_block", tuning.m_bucket(m), n, k, out_dtype, tuple(block_size), bias is not None)
        candidates = [c for c in tuning.gemm_candidates(m, lambda bk: triton.cdiv(k, bk)) if group_k % c.block_k == 0]
        config = tuning.pick(key, candidates, run, xq.device)
    if group_k % config.block_k:
        raise ValueError(f"block_k {config.block_k} must divide the scale group {group_k}")
    return run(config)


def fp8_block_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, block_size=(128, 128),
                   bias: Optional[torch.Tensor] = None, config: Optional[tuning.GemmConfig] = None) -> torch.Tensor:
    xq, xs = per_token_group_quant_fp8(x, block_size[1])
    return fp8_block_gemm_quantized(xq, xs, weight, weight_scale_inv, block_size, x.dtype, bias, config)
