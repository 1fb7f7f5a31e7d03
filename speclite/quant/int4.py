"""4-bit group-wise weights and their packed layouts (GPTQ v1/v2 and AWQ GEMM).

Inside speclite a 4-bit weight is an `Int4Weight`: unpacked values q [N, K] in 0..15, real zero
points [G, N], fp16 scales [G, N] and g_idx [K] (input channel -> group), so that
W[n, k] = (q[n, k] - zeros[g_idx[k], n]) * scales[g_idx[k], n]. Every format converts to and
from this one representation; a last group shorter than group_size is simply a smaller group.
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass

import torch

from speclite.errors import SpecliteError
from speclite.kernels.exact import quotient
from speclite.quant.rows import row_slices, run_chunks

MAXQ = 15
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64)  # unpacking
# AWQ's GEMM layout puts output column ORDER[i] in nibble i of each int32.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass
class Int4Weight:
    q: torch.Tensor  # uint8 [N, K], 0..15
    zeros: torch.Tensor  # uint8 [G, N], real zero points
    scales: torch.Tensor  # fp16 [G, N]
    g_idx: torch.Tensor  # int32 [K]
    group_size: int

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        g = self.g_idx.long()
        s = self.scales.float()[g]  # [K, N]
        z = self.zeros.float()[g]
        return ((self.q.float().t() - z) * s).t().to(dtype).contiguous()


def group_params(w: torch.Tensor, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero for groups along the last dim of w [..., g] (GPTQ's min/max convention).

    The range always includes 0. Asymmetric zeros are kept in 1..15 so the v1 convention's
    stored zero-1 is never negative (readers that do not mask the +1 still decode it right).
    The scale is rounded to fp16 first: that is the value the checkpoint stores.
    """
    wmin = w.amin(-1).clamp(max=0)
    wmax = w.amax(-1).clamp(min=0)
    if sym:
        m = torch.maximum(-wmin, wmax)
        scale = quotient(2 * m, MAXQ)
        zero = torch.full_like(scale, (MAXQ + 1) // 2)
    else:
        scale = quotient(wmax - wmin, MAXQ)
        zero = None
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).half().float()
    if zero is None:
        zero = (-wmin / scale).round().clamp(1, MAXQ)
    return scale, zero


def quantize_values_(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """round(w / scale) + zero clamped to 0..15, computed in w's own memory."""
    return w.div_(scale).round_().add_(zero).clamp_(0, MAXQ)


def quantize_rtn(weight: torch.Tensor, group_size: int, sym: bool, pool: Executor | None = None) -> Int4Weight:
    """Round-to-nearest per group of `group_size` input channels; no data needed."""
    n, k = weight.shape
    q, scale, zero = _rtn(weight, group_size, sym, False, pool)
    return Int4Weight(q, zero.t().to(torch.uint8).contiguous(), scale.t().half().contiguous(),
                      _g_idx(k, group_size), group_size)


def rtn_gptq(weight: torch.Tensor, group_size: int, sym: bool, name: str,
             pool: Executor | None = None) -> dict[str, torch.Tensor]:
    """to_gptq(quantize_rtn(...)) without the unpacked values: each chunk leaves its codes as bytes of
    two nibbles, which read as int32 are GPTQ's words along K (qweight is their transpose)."""
    n, k = weight.shape
    _check_packable(n, k, name)
    pairs, scale, zero = _rtn(weight, group_size, sym, True, pool)
    return _gptq_tensors(pairs.view(torch.int32).t().contiguous(), zero.t().to(torch.uint8), scale.t(),
                         _g_idx(k, group_size), True)


def _rtn(weight: torch.Tensor, group_size: int, sym: bool, pairs: bool, pool: Executor | None):
    """(codes uint8 [N, K], or [N, K/2] with code 2j in the low and 2j+1 in the high nibble; scale, zero [N, G]).

    Per row chunk: one float32 copy, zero-padded to whole groups (the padding cannot move a group's
    min/max: the range includes 0 anyway), rounded in place while it is in cache.
    """
    n, k = weight.shape
    groups = -(-k // group_size)
    width = groups * group_size
    on = weight.device  # a GPU's weights quantize there: a 7B model in seconds, where a copy to the CPU took minutes
    codes = torch.empty(n, k // 2 if pairs else k, dtype=torch.uint8, device=on)
    scale, zero = torch.empty(n, groups, device=on), torch.empty(n, groups, device=on)

    def chunk(rows: slice) -> None:
        m = rows.stop - rows.start
        w = torch.zeros(m, width, device=on) if width > k else torch.empty(m, k, device=on)
        w[:, :k] = weight[rows]
        g = w.view(m, groups, group_size)
        s, z = group_params(g, sym)
        quantize_values_(g, s[..., None], z[..., None])
        if pairs:
            two = w[:, :k].unflatten(1, (-1, 2))
            codes[rows] = torch.add(two[..., 0], two[..., 1], alpha=16)  # exact: integers below 256
        else:
            codes[rows] = w[:, :k]
        scale[rows], zero[rows] = s, z

    run_chunks(chunk, row_slices(n, width), pool)
    return codes, scale, zero


def _g_idx(k: int, group_size: int) -> torch.Tensor:
    return (torch.arange(k) // group_size).to(torch.int32)


def pack_nibbles(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Pack 8 consecutive 4-bit values along `dim` into one int32, lowest bits first.

    Two nibbles per byte, four bytes read as one little-endian int32 (x86 and ARM alike).
    """
    v = values.to(torch.uint8).movedim(dim, -1).contiguous()
    v = v.view(*v.shape[:-1], -1, 2)
    return (v[..., 0] | (v[..., 1] << 4)).view(torch.int32).movedim(-1, dim).contiguous()


def unpack_nibbles(words: torch.Tensor, dim: int) -> torch.Tensor:
    w = words.to(torch.int64).movedim(dim, -1) & 0xFFFFFFFF
    v = (w[..., None] >> _SHIFTS.to(w.device)) & 0xF
    return v.reshape(*v.shape[:-2], -1).movedim(-1, dim)


def _check_packable(n: int, k: int, name: str) -> None:
    if k % 8 or n % 8:
        raise SpecliteError(f"{name}: int4 packing needs both dimensions divisible by 8, got [{n}, {k}]")


def to_gptq(w: Int4Weight, name: str, v1: bool = True) -> dict[str, torch.Tensor]:
    """GPTQ tensors (suffixes qweight/qzeros/scales/g_idx); v1 stores zero-1 (masked to 4 bits)."""
    n, k = w.q.shape
    _check_packable(n, k, name)
    return _gptq_tensors(pack_nibbles(w.q.t(), 0), w.zeros, w.scales, w.g_idx, v1)


def _gptq_tensors(qweight, zeros, scales, g_idx, v1: bool) -> dict[str, torch.Tensor]:
    zeros = zeros.to(torch.int64) - (1 if v1 else 0)
    return {
        "qweight": qweight,
        "qzeros": pack_nibbles(zeros & 0xF, 1),
        "scales": scales.half().contiguous(),
        "g_idx": g_idx.to(torch.int32).contiguous(),
    }


def from_gptq(qweight, qzeros, scales, g_idx, group_size: int, v1: bool) -> Int4Weight:
    q = unpack_nibbles(qweight, 0).t()  # [N, K]
    zeros = unpack_nibbles(qzeros, 1)[:, : scales.shape[1]]
    if v1:
        zeros = (zeros + 1) & 0xF
    k = q.shape[1]
    if g_idx is None:
        g_idx = torch.arange(k) // group_size
    return Int4Weight(q.to(torch.uint8).contiguous(), zeros.to(torch.uint8), scales.half(), g_idx.to(torch.int32), group_size)


def from_awq(qweight, qzeros, scales, group_size: int) -> Int4Weight:
    """AWQ GEMM: qweight [K, N/8] and qzeros [G, N/8] packed along N in AWQ_ORDER, zeros as-is."""
    order = list(AWQ_ORDER)

    def unpack(words):
        nib = unpack_nibbles(words, 1)  # [R, N] in nibble order within each word
        nib = nib.view(nib.shape[0], -1, 8)
        out = torch.empty_like(nib)
        out[..., order] = nib
        return out.view(nib.shape[0], -1)

    q = unpack(qweight).t()
    k = q.shape[1]
    return Int4Weight(
        q.to(torch.uint8).contiguous(),
        unpack(qzeros).to(torch.uint8),
        scales.half(),
        (torch.arange(k) // group_size).to(torch.int32),
        group_size,
    )
