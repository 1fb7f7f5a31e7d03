"""Triton W4A16 GEMM: int4 unpack and dequantize fused into the matmul's K loop.

One kernel body serves both shapes: with BLOCK_M=16 and a split-K grid it is the GEMV-shaped
variant for decode and k+1-token verify (M up to tuning.GEMV_ROWS: memory bound, so many programs
stream disjoint K ranges of the weight), with large tiles and one split it is the tiled prefill
GEMM. The split count is the grid's third axis, not a constexpr, so splits share one compile.
The tuner picks per shape, one config for every decode and verification row count.
"""

import weakref
from typing import Optional

import torch
import triton
import triton.language as tl

from . import tuning
from .triton_common import dot_precision, finish_split_k, gemm_out_buffers, split_k_range


@triton.jit
def _w4a16_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, gidx_ptr, out_ptr,
    M, N, K, stride_xm,
    GROUP_SIZE: tl.constexpr, HAS_GIDX: tl.constexpr, TILE_IN_ONE_GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    zero_shift = (offs_n % 8) * 4
    first, last = split_k_range(pid_k, K, BLOCK_K, tl.num_programs(2))

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kt in range(first, last):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        mask_kn = mask_k[:, None] & mask_n[None, :]
        packed = tl.load(qw_ptr + (offs_k // 8)[:, None] * N + offs_n[None, :], mask=mask_kn, other=0)
        q = (packed >> ((offs_k % 8) * 4)[:, None]) & 0xF
        if TILE_IN_ONE_GROUP:
            # Whole tile inside one group: one row of scales/zeros, broadcast over K.
            g = (kt * BLOCK_K) // GROUP_SIZE
            scale = tl.load(s_ptr + g * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            zp = tl.load(qz_ptr + g * (N // 8) + offs_n // 8, mask=mask_n, other=0)
            zero = ((zp >> zero_shift) & 0xF)[None, :]
        else:
            if HAS_GIDX:
                g = tl.load(gidx_ptr + offs_k, mask=mask_k, other=0)
            else:
                g = offs_k // GROUP_SIZE
            scale = tl.load(s_ptr + g[:, None] * N + offs_n[None, :], mask=mask_kn, other=0.0).to(tl.float32)
            zp = tl.load(qz_ptr + g[:, None] * (N // 8) + (offs_n // 8)[None, :], mask=mask_kn, other=0)
            zero = (zp >> zero_shift[None, :]) & 0xF
        w = ((q - zero).to(tl.float32) * scale).to(a.dtype)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)

    # split pid_k writes its fp32 partial to workspace slice pid_k; without split-K, pid_k = 0: the output
    dst = out_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


_trivial_gidx: dict = {}  # id(g_idx) -> (weakref to it, its version, is it k // group_size)


def _drop_trivial_gidx(g_idx: Optional[torch.Tensor], group_size: int) -> Optional[torch.Tensor]:
    """None when g_idx is just k // group_size (checkpoints without act-order still ship one):
    the kernel then loads one scale row per K tile instead of gathering per channel. The check
    syncs once per g_idx tensor, so run each layer once before capturing a CUDA graph."""
    if g_idx is None:
        return None
    entry = _trivial_gidx.get(id(g_idx))
    if entry is None or entry[0]() is not g_idx or entry[1] != g_idx._version:
        plain = torch.arange(g_idx.numel(), device=g_idx.device) // group_size
        entry = (weakref.ref(g_idx), g_idx._version, bool(torch.equal(g_idx.long(), plain)))
        _trivial_gidx[id(g_idx)] = entry
        weakref.finalize(g_idx, _trivial_gidx.pop, id(g_idx), None)
    return None if entry[2] else g_idx


def w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               g_idx: Optional[torch.Tensor], group_size: int,
               config: Optional[tuning.GemmConfig] = None) -> torch.Tensor:
    """Same contract as speclite.kernels.w4a16_gemm; config pins the launch (tests), else tuned."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    n = qweight.shape[1]
    g_idx = _drop_trivial_gidx(g_idx, group_size)
    gidx = g_idx.to(torch.int32).contiguous() if g_idx is not None else None

    def run(cfg: tuning.GemmConfig) -> torch.Tensor:
        out, target = gemm_out_buffers(m, n, cfg.split_k, x.dtype, x.device)
        grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), cfg.split_k)
        _w4a16_kernel[grid](
            x, qweight, qzeros, scales, gidx if gidx is not None else qweight, target,
            m, n, k, x.stride(0),
            GROUP_SIZE=group_size, HAS_GIDX=gidx is not None,
            TILE_IN_ONE_GROUP=gidx is None and group_size % cfg.block_k == 0,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            DOT_PRECISION=dot_precision(x.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return finish_split_k(out, target, cfg.split_k)

    if config is None:
        key = ("w4a16", tuning.m_bucket(m), n, k, x.dtype, group_size, gidx is not None)
        config = tuning.pick(key, tuning.gemm_candidates(m, lambda bk: triton.cdiv(k, bk)), run, x.device)
    return run(config)
