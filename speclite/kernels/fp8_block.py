"""FP8 block-scaled GEMM (the `fp8-block` format) and its per-token-group activation quantizer.

Weights: float8_e4m3fn [N, K] with weight_scale_inv fp32 [ceil(N/bn), ceil(K/bk)], a block
dequantizes as value * scale. Activations are quantized at run time per token per bk-channel
group, so every (token group, weight block) pair has one scale product.
"""

import torch

from .dispatch import fp8_dot_supported, use_triton
from .exact import quotient

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_SCALE_EPS = 1e-10  # floor on scales: an all-zero group must not divide by zero


def per_token_group_quant_fp8_torch(x: torch.Tensor, group_size: int = 128):
    """x [M, K] -> (x_fp8 [M, K], scales fp32 [M, ceil(K/group_size)]), x ~= x_fp8 * scale."""
    m, k = x.shape
    groups = -(-k // group_size)
    xg = torch.nn.functional.pad(x.float(), (0, groups * group_size - k)).view(m, groups, group_size)
    scales = torch.clamp(quotient(xg.abs().amax(dim=-1), FP8_MAX), min=FP8_SCALE_EPS)
    xq = torch.clamp(xg / scales.unsqueeze(-1), -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return xq.view(m, groups * group_size)[:, :k].contiguous(), scales


def dequantize_fp8_block(weight: torch.Tensor, weight_scale_inv: torch.Tensor, block_size=(128, 128)) -> torch.Tensor:
    """Dense fp32 [N, K] from an fp8 block-scaled weight."""
    n, k = weight.shape
    bn, bk = block_size
    scale = weight_scale_inv.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return weight.float() * scale


def fp8_block_gemm_torch(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                         block_size=(128, 128), bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference and CPU path: quantize x like the kernel does, dequantize both sides, fp32 matmul (+ bias)."""
    xq, xs = per_token_group_quant_fp8_torch(x, block_size[1])
    return fp8_block_gemm_quantized_torch(xq, xs, weight, weight_scale_inv, block_size, x.dtype, bias)


def fp8_block_gemm_quantized_torch(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor,
                                   weight_scale_inv: torch.Tensor, block_size, out_dtype,
                                   bias: torch.Tensor | None = None) -> torch.Tensor:
    k = xq.shape[1]
    x_deq = xq.float() * xs.repeat_interleave(block_size[1], dim=1)[:, :k]
    y = x_deq @ dequantize_fp8_block(weight, weight_scale_inv, block_size).T
    return (y if bias is None else y + bias.float()).to(out_dtype)


def _triton_ok(x: torch.Tensor) -> bool:
    return use_triton(x) and fp8_dot_supported(x)


def per_token_group_quant_fp8(x: torch.Tensor, group_size: int = 128):
    if _triton_ok(x):
        from . import fp8_block_triton

        return fp8_block_triton.per_token_group_quant_fp8(x, group_size)
    return per_token_group_quant_fp8_torch(x, group_size)


def fp8_block_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                   block_size=(128, 128), bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias, added in fp32 before the rounding) in x's dtype; x is quantized per token per
    block_size[1] channels inside."""
    if _triton_ok(x):
        from . import fp8_block_triton

        return fp8_block_triton.fp8_block_gemm(x, weight, weight_scale_inv, tuple(block_size), bias)
    return fp8_block_gemm_torch(x, weight, weight_scale_inv, tuple(block_size), bias)


def fp8_block_gemm_quantized(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                             block_size, out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp8_block_gemm on activations already quantized per token group (by a kernel that made them)."""
    if _triton_ok(xq):
        from . import fp8_block_triton

        return fp8_block_triton.fp8_block_gemm_quantized(xq, xs, weight, weight_scale_inv, tuple(block_size),
                                                         out_dtype, bias)
    return fp8_block_gemm_quantized_torch(xq, xs, weight, weight_scale_inv, tuple(block_size), out_dtype, bias)
