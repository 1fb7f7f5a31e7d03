"""Triton W4A16 GEMM: int4 unpack and dequantize fused into the matmul's K loop.

One kernel body serves both shapes: with BLOCK_M=16 and a split-K grid it is the GEMV-shaped
variant for decode and k+1-token verify (M up to tuning.GEMV_ROWS: memory bound, so many programs
stream disjoint K ranges of the weight), with large tiles and one split it is the tiled prefill
GEMM. The split count is the grid's third axis, not a constexpr, so splits share one compile.
The tuner picks per shape, one config for every decode and verification row count.

A tile inside one quantization group (no act-order, BLOCK_K dividing the group) multiplies
integers (q and the zero points) and scales the tile's result once; with BLOCK_K >= 128 it also
loads each packed word once rather than once per nibble. On an H200 the first version (every
weight shifted, dequantized and rounded on its own, each word loaded eight times) reached 6-17%
of copy bandwidth at M = 1 (benchmarks/RESULTS.md, GPU), with the tuner's picks then unreliable
as well. Compiled for sm_90a (tests/hopper_compile.py) its decode tiles' K loop issued 0.29-0.50
warp instructions a weight in 25-173 KB of shared memory; these tiles 0.14-0.26 in 6-22 KB, where
int4 at 80% of an H200's copy bandwidth allows about 0.16 (a warp instruction a cycle per scheduler).
"""

import weakref
from typing import Optional

import torch
import triton
import triton.language as tl

from . import tuning
from .triton_common import dot_precision, gemm_out_buffers, gemm_tile, store_split, with_bias


@triton.jit
def _w4a16_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, gidx_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, stride_xm, stride_qw, stride_qz, stride_s,
    GROUP_SIZE: tl.constexpr, HAS_GIDX: tl.constexpr, TILE_IN_ONE_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, NIBBLE_BITS: tl.constexpr, NIBBLE_BIAS: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n, first, last = gemm_tile(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    zero_shift = (offs_n % 8) * 4

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kt in range(first, last):
        if TILE_IN_ONE_GROUP:
            # One group's scale and zero for the whole tile: the dots take integers (exact in any float
            # dtype) and the scale multiplies the tile's [M, N] result once, not each weight.
            g = (kt * BLOCK_K) // GROUP_SIZE
            scale = tl.load(s_ptr + g * stride_s + offs_n, mask=mask_n, other=0.0).to(tl.float32)
            zero = (tl.load(qz_ptr + g * stride_qz + offs_n // 8, mask=mask_n, other=0) >> zero_shift) & 0xF
            if BLOCK_K >= 128:
                # Each packed word loaded once: nibble j of row r is channel 8r + j, so the tile is 8
                # dots of BLOCK_K / 8 (>= 16, tl.dot's least K) channels, x's columns 8r + j beside them.
                # For 16-bit x a nibble q becomes the float NIBBLE_BIAS + q by OR-ing it under that power
                # of two's bits (exact, no conversion); the zero points (plus the bias) are a dot of their
                # own with -x, so nothing but bit operations stands between the loaded words and the dot
                # (Triton then unpacks in the dot operand's registers: no shared-memory trip per nibble).
                rows = kt * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
                mask_r = rows < K // 8
                packed = tl.load(qw_ptr + rows[:, None] * stride_qw + offs_n[None, :],
                                 mask=mask_r[:, None] & mask_n[None, :], other=0)
                zeros = tl.broadcast_to(zero[None, :] + NIBBLE_BIAS, [BLOCK_K // 8, BLOCK_N])
                zeros = zeros.to(x_ptr.dtype.element_ty)
                part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for j in tl.static_range(8):
                    a = tl.load(x_ptr + offs_m[:, None] * stride_xm + (rows * 8 + j)[None, :],
                                mask=mask_m[:, None] & mask_r[None, :], other=0.0)
                    q = (packed >> (4 * j)) & 0xF
                    if NIBBLE_BITS:
                        w = (q | NIBBLE_BITS).to(tl.int16).to(a.dtype, bitcast=True)
                    else:
                        w = q.to(a.dtype)
                    part = tl.dot(a, w, part, input_precision=DOT_PRECISION)
                    part = tl.dot(-a, zeros, part, input_precision=DOT_PRECISION)
            else:
                offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
                mask_k = offs_k < K
                a = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                            mask=mask_m[:, None] & mask_k[None, :], other=0.0)
                packed = tl.load(qw_ptr + (offs_k // 8)[:, None] * stride_qw + offs_n[None, :],
                                 mask=mask_k[:, None] & mask_n[None, :], other=0)
                w = (((packed >> ((offs_k % 8) * 4)[:, None]) & 0xF) - zero[None, :]).to(a.dtype)
                part = tl.dot(a, w, input_precision=DOT_PRECISION)
            acc += part * scale[None, :]
        else:
            # Groups change within the tile (act-order g_idx, or groups narrower than BLOCK_K): each
            # weight dequantized with its own group's scale and zero.
            offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            a = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                        mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            mask_kn = mask_k[:, None] & mask_n[None, :]
            packed = tl.load(qw_ptr + (offs_k // 8)[:, None] * stride_qw + offs_n[None, :], mask=mask_kn, other=0)
            q = (packed >> ((offs_k % 8) * 4)[:, None]) & 0xF
            if HAS_GIDX:
                g = tl.load(gidx_ptr + offs_k, mask=mask_k, other=0)
            else:
                g = offs_k // GROUP_SIZE
            scale = tl.load(s_ptr + g[:, None] * stride_s + offs_n[None, :], mask=mask_kn, other=0.0).to(tl.float32)
            zp = tl.load(qz_ptr + g[:, None] * stride_qz + (offs_n // 8)[None, :], mask=mask_kn, other=0)
            zero = (zp >> zero_shift[None, :]) & 0xF
            w = ((q - zero).to(tl.float32) * scale).to(a.dtype)
            acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)

    acc = with_bias(acc, b_ptr, offs_n, mask_n, HAS_BIAS)
    store_split(out_ptr, part_ptr, count_ptr, acc, M, N, offs_m, offs_n, mask_m, mask_n)


# dtype -> (the bits of a power of two p whose float's low mantissa bits take a nibble q, p): OR-ed
# together they are the float p + q, exactly. Compiled for sm_90a the tiles' K loop issues 0.14 warp
# instructions a weight this way against 0.19 converting each nibble (shift, sign extension, int to float).
NIBBLE_FLOATS = {torch.bfloat16: (0x4300, 128), torch.float16: (0x6400, 1024)}

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
               g_idx: Optional[torch.Tensor], group_size: int, bias: Optional[torch.Tensor] = None,
               config: Optional[tuning.GemmConfig] = None) -> torch.Tensor:
    """Same contract as speclite.kernels.w4a16_gemm; config pins the launch (tests), else tuned."""
    # The packed tensors may be column ranges of wider ones (decoder.join_projections): rows strided.
    x, qweight, qzeros, scales = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, qweight, qzeros, scales))
    m, k = x.shape
    n = qweight.shape[1]
    g_idx = _drop_trivial_gidx(g_idx, group_size)
    gidx = g_idx.to(torch.int32).contiguous() if g_idx is not None else None

    nibble_bits, nibble_bias = NIBBLE_FLOATS.get(x.dtype, (0, 0))

    def run(cfg: tuning.GemmConfig) -> torch.Tensor:
        grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), cfg.split_k)
        out, parts, counts = gemm_out_buffers(m, n, cfg.split_k, x.dtype, x.device, grid[0] * grid[1])
        _w4a16_kernel[grid](
            x, qweight, qzeros, scales, gidx if gidx is not None else qweight, qweight if bias is None else bias,
            out, parts, counts, m, n, k, x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0),
            GROUP_SIZE=group_size, HAS_GIDX=gidx is not None, HAS_BIAS=bias is not None,
            TILE_IN_ONE_GROUP=gidx is None and group_size % cfg.block_k == 0,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            DOT_PRECISION=dot_precision(x.dtype), NIBBLE_BITS=nibble_bits, NIBBLE_BIAS=nibble_bias,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return out

    if config is None:
        key = ("w4a16", tuning.m_bucket(m), n, k, x.dtype, group_size, gidx is not None, bias is not None)
        candidates = tuning.gemm_candidates(m, lambda bk: triton.cdiv(k, bk))
        # Where tiles of whole packed words inside one group exist, only they: compiled for sm_90a their
        # K loop issues 0.14-0.26 warp instructions a weight against 0.30-0.50 for BLOCK_K 64, and BLOCK_K 256
        # across groups takes 100-740 KB of shared memory (tests/hopper_compile.py); each candidate
        # costs a compile on the GPU.
        whole = [c for c in candidates if gidx is None and c.block_k >= 128 and group_size % c.block_k == 0]
        config = tuning.pick(key, whole or candidates, run, x.device)
    return run(config)
