"""W4A16: GPTQ-packed int4 weights (group scales and zeros, optional act-order g_idx) x float activations.

Format (DESIGN.md): qweight int32 [K//8, N] packs 8 input channels per int32 along K,
lowest nibble first; qzeros int32 [G, N//8] packs 8 output channels along N, lowest first,
holding the real zero points; scales [G, N]; w[k, n] = (q[k, n] - zero[g[k], n]) * scale[g[k], n].
"""

from typing import Optional

import torch

from .dispatch import use_triton

_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def unpack_int4_rows(qweight: torch.Tensor) -> torch.Tensor:
    """int32 [K//8, N] packed along K -> int32 [K, N] nibbles."""
    nib = (qweight.unsqueeze(1) >> _SHIFTS.to(qweight.device).view(1, 8, 1)) & 0xF
    return nib.reshape(qweight.shape[0] * 8, qweight.shape[1])


def unpack_int4_cols(qzeros: torch.Tensor) -> torch.Tensor:
    """int32 [G, N//8] packed along N -> int32 [G, N] nibbles."""
    nib = (qzeros.unsqueeze(2) >> _SHIFTS.to(qzeros.device).view(1, 1, 8)) & 0xF
    return nib.reshape(qzeros.shape[0], qzeros.shape[1] * 8)


def group_index(k: int, group_size: int, g_idx: Optional[torch.Tensor], device: torch.device) -> torch.Tensor:
    if g_idx is not None:
        return g_idx.to(device=device, dtype=torch.long)
    return torch.arange(k, device=device) // group_size


def dequantize_gptq_int4(qweight, qzeros, scales, g_idx, group_size) -> torch.Tensor:
    """Dense fp32 weight [K, N]."""
    q = unpack_int4_rows(qweight)
    g = group_index(q.shape[0], group_size, g_idx, q.device)
    zeros = unpack_int4_cols(qzeros)[g]
    return (q - zeros).float() * scales.float()[g]


def w4a16_gemm_torch(x, qweight, qzeros, scales, g_idx, group_size, bias=None) -> torch.Tensor:
    """Reference and CPU path: dequantize to fp32, one fp32 matmul (+ bias), cast to x's dtype."""
    w = dequantize_gptq_int4(qweight, qzeros, scales, g_idx, group_size)
    y = x.float() @ w
    return (y if bias is None else y + bias.float()).to(x.dtype)


def w4a16_gemm(x, qweight, qzeros, scales, g_idx, group_size, bias=None) -> torch.Tensor:
    """y = x @ dequant(W) (+ bias, added in fp32 before the rounding), x [M, K] -> y [M, N] in x's dtype."""
    if use_triton(x):
        from . import w4a16_triton

        return w4a16_triton.w4a16_gemm(x, qweight, qzeros, scales, g_idx, group_size, bias)
    return w4a16_gemm_torch(x, qweight, qzeros, scales, g_idx, group_size, bias)
