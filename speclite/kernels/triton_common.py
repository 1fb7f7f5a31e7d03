"""Pieces shared by the Triton kernels: exact rounding and the split-K GEMMs' tiles and reduction."""

import torch
import triton
import triton.language as tl


@triton.jit
def round_half_even(v):
    """torch.round semantics (ties to even) for |v| < 2**22.

    libdevice.rint would do, but the interpreter cannot run libdevice calls.
    """
    f = tl.floor(v)
    d = v - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)


@triton.jit
def round_to_e4m3(v):
    """v (|v| <= 448) rounded to the nearest float8_e4m3fn value, ties to even, still in fp32, so the
    conversion after it is exact: on an H200 Triton 3.6's own fp32 -> e4m3 conversion disagreed with
    torch's (round to nearest even) in one element in 100-1000."""
    exponent = tl.maximum(((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)  # subnormals: 2**-6's spacing
    # e4m3 keeps 3 mantissa bits: the spacing is 2**(exponent - 3), a power of two (exact to scale by).
    inv_spacing = ((127 + 3 - exponent) << 23).to(tl.float32, bitcast=True)
    spacing = ((127 - 3 + exponent) << 23).to(tl.float32, bitcast=True)
    return round_half_even(v * inv_spacing) * spacing


@triton.jit
def fp8_group_scale(absmax, FP8_MAX: tl.constexpr, EPS: tl.constexpr):
    """An fp8 activation group's scale from its absolute maximum, as fp8_block.per_token_group_quant_fp8_torch
    (div_rn: Triton's plain fp32 '/' is approximate; the torch path divides exactly)."""
    return tl.maximum(tl.math.div_rn(absmax, FP8_MAX), EPS)


@triton.jit
def to_e4m3(x, scale, FP8_MAX: tl.constexpr):
    """x / scale, clamped and rounded to an e4m3 value (still fp32: the conversion after it is exact)."""
    return round_to_e4m3(tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX))


@triton.jit
def int8_row_scale(absmax, EPS: tl.constexpr):
    """A token's int8 activation scale from its absolute maximum, as int8.per_token_quant_int8_torch."""
    return tl.maximum(tl.math.div_rn(absmax, 127.0), EPS)


@triton.jit
def to_int8(x, scale):
    """x / scale rounded half to even and clamped to [-127, 127] (still fp32)."""
    return tl.minimum(tl.maximum(round_half_even(tl.math.div_rn(x, scale)), -127.0), 127.0)


_tile_counts: dict = {}  # device -> int32 zeros, one per output tile of a split kernel (left zero after each)


def tile_counts(device: torch.device, tiles: int) -> torch.Tensor:
    """The arrival counts store_split (and the attention's chunks) keep per output tile: allocated once
    per device, before any CUDA graph captures a kernel (the tuner runs each GEMM shape eagerly first)."""
    counts = _tile_counts.get(device)
    if counts is None or counts.numel() < tiles:
        counts = _tile_counts[device] = torch.zeros(max(tiles, 1 << 16), dtype=torch.int32, device=device)
    return counts


def gemm_out_buffers(m: int, n: int, split_k: int, dtype: torch.dtype, device: torch.device, tiles: int):
    """(out, partials, counts) for a GEMM kernel's store_split: out, split-K's fp32 partials (out itself,
    never read, without), and the per-tile arrival counts."""
    out = torch.empty((m, n), dtype=dtype, device=device)
    counts = tile_counts(device, tiles)
    if split_k == 1:
        return out, out, counts
    return out, torch.empty((split_k, m, n), dtype=torch.float32, device=device), counts


@triton.jit
def gemm_tile(M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A split-K GEMM program's rows and columns (with their masks) and its [first, last) K tiles;
    the grid is (row tiles, column tiles, splits), each split a contiguous run of equal tile count."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, tl.num_programs(2))
    first = tl.program_id(2) * per_split
    return offs_m, offs_n, offs_m < M, offs_n < N, first, tl.minimum(first + per_split, k_tiles)


@triton.jit
def with_bias(acc, b_ptr, offs_n, mask_n, HAS_BIAS: tl.constexpr):
    """A GEMM program's fp32 result plus the bias, added by the first split alone: once, and in the same
    place at every row count."""
    if HAS_BIAS:
        if tl.program_id(2) == 0:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def last_to_arrive(count, arrivals):
    """Whether this program is the last of `arrivals` programs to count in at `count` (a zero int32 in
    tile_counts): every thread's stores are made before it counts in (a CTA barrier, then an
    acquire-release add at gpu scope), so the last one may read them all, from L2 (.cg loads: not
    this SM's L1), and must then set the count back to zero for the next call (reset_count)."""
    tl.debug_barrier()
    return tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == arrivals - 1


@triton.jit
def reset_count(count):
    tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")


@triton.jit
def store_split(out_ptr, part_ptr, count_ptr, y, M, N, offs_m, offs_n, mask_m, mask_n):
    """A program's fp32 result y into out. Split-K: each split stores its partial in slice k of the
    partials, and the tile's last split to arrive (a count per tile) sums the slices in split order,
    whatever order they finished in, and writes out: the fixed order of a separate reduction kernel,
    without its launch. The count goes back to zero for the next call."""
    splits = tl.num_programs(2)
    mask = mask_m[:, None] & mask_n[None, :]
    tile = offs_m[:, None] * N + offs_n[None, :]
    if splits == 1:
        tl.store(out_ptr + tile, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + tl.program_id(2) * M * N + tile, y, mask=mask)
        count = count_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        if last_to_arrive(count, splits):
            total = tl.zeros_like(y)
            for s in range(splits):
                total += tl.load(part_ptr + s * M * N + tile, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + tile, total.to(out_ptr.dtype.element_ty), mask=mask)
            reset_count(count)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 operands must not silently drop to tf32."""
    return "ieee" if dtype == torch.float32 else "tf32"
