"""W8A8 int8 (compressed-tensors `int-quantized`): per-channel int8 weights, dynamic per-token int8 activations.

y = (xq @ wq^T) * sx * sw with exact int32 accumulation; the scales are applied once, after.
"""

import torch
import torch.nn.functional as F

from .dispatch import use_triton
from .exact import quotient

INT8_SCALE_EPS = 1e-10  # floor on scales: an all-zero row must not divide by zero


def per_token_quant_int8_torch(x: torch.Tensor):
    """x [M, K] -> (int8 [M, K], fp32 scales [M, 1]), symmetric, scale = absmax / 127, ties to even."""
    xf = x.float()
    scales = torch.clamp(quotient(xf.abs().amax(dim=1, keepdim=True), 127.0), min=INT8_SCALE_EPS)
    return torch.clamp(torch.round(xf / scales), -127, 127).to(torch.int8), scales


def int8_matmul_exact(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """int32 a [M, K] @ b_t[N, K]^T with torch._int_mm, padded to what its CUDA kernel accepts
    (M > 16, K and N multiples of 8); the CPU kernel takes any shape."""
    m, k = a.shape
    n = b_t.shape[0]
    if not a.is_cuda:
        return torch._int_mm(a, b_t.t())
    pad_k, pad_n = -k % 8, -n % 8
    a = F.pad(a, (0, pad_k, 0, max(0, 17 - m)))
    b_t = F.pad(b_t, (0, pad_k, 0, pad_n))
    return torch._int_mm(a, b_t.t())[:m, :n]


def int8_gemm_torch(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference and CPU path."""
    return int8_gemm_quantized_torch(*per_token_quant_int8_torch(x), weight, weight_scale, x.dtype, bias)


def int8_gemm_quantized_torch(xq: torch.Tensor, sx: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                              out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = int8_matmul_exact(xq, weight).float() * sx * weight_scale.float().view(1, -1)
    return (y if bias is None else y + bias.float()).to(out_dtype)


def per_token_quant_int8(x: torch.Tensor):
    if use_triton(x):
        from . import int8_triton

        return int8_triton.per_token_quant_int8(x)
    return per_token_quant_int8_torch(x)


def int8_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float, weight int8 [N, K], weight_scale fp32 [N, 1] -> y [M, N] (+ bias, added in fp32 before
    the rounding) in x's dtype."""
    if use_triton(x):
        from . import int8_triton

        return int8_triton.int8_gemm(x, weight, weight_scale, bias)
    return int8_gemm_torch(x, weight, weight_scale, bias)


def int8_gemm_quantized(xq: torch.Tensor, sx: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                        out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """int8_gemm on activations already quantized per token (by a kernel that made them)."""
    if use_triton(xq):
        from . import int8_triton

        return int8_triton.int8_gemm_quantized(xq, sx, weight, weight_scale, out_dtype, bias)
    return int8_gemm_quantized_torch(xq, sx, weight, weight_scale, out_dtype, bias)
