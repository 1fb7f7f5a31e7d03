"""Pieces shared by the Triton kernels: exact rounding and the split-K reduction."""

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
def _splitk_reduce_kernel(ws_ptr, out_ptr, numel, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    # Sums the fp32 partials in a fixed order (deterministic, unlike atomics) and casts once.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ws_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def gemm_out_buffers(m: int, n: int, split_k: int, dtype: torch.dtype, device: torch.device):
    """(out, target): the kernel writes to target, which is out itself or an fp32 split-K workspace."""
    out = torch.empty((m, n), dtype=dtype, device=device)
    if split_k == 1:
        return out, out
    return out, torch.empty((split_k, m, n), dtype=torch.float32, device=device)


def finish_split_k(out: torch.Tensor, target: torch.Tensor, split_k: int) -> torch.Tensor:
    if split_k > 1:
        block = 1024
        _splitk_reduce_kernel[(triton.cdiv(out.numel(), block),)](target, out, out.numel(), SPLIT_K=split_k, BLOCK=block)
    return out


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
def store_split(out_ptr, y, M, N, offs_m, offs_n, mask_m, mask_n):
    """Split k's partial into workspace slice k (fp32, summed by finish_split_k); without split-K,
    split 0 writes the output itself."""
    dst = out_ptr + tl.program_id(2) * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 operands must not silently drop to tf32."""
    return "ieee" if dtype == torch.float32 else "tf32"
