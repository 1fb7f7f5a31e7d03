"""The dense linear layer: speclite's own kernels where they apply, torch elsewhere.

On the CPU, bf16/f16 weights go through our kernels (cpu_gemm) for any number of rows (decode,
verification, prefill); they compute a row the same way whatever the other rows are, so verifying
k+1 tokens gives exactly the logits of k+1 single-token steps. Without them, one row goes through
torch.mv (measured ~30-45% faster than the general matmul for a single row). On a GPU the decode
and verification rows (up to tuning.GEMV_ROWS) take the Triton GEMM for the same reason
(dense_triton); a prefill's many rows take torch's matmul.
"""

import torch
import torch.nn.functional as F

from speclite.kernels import cpu_gemm, tuning
from speclite.kernels.dispatch import use_triton

HALF = (torch.bfloat16, torch.float16)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight^T + bias; a weight narrower than x (speclite.model.narrow) is widened to x's dtype
    where torch's ops take it."""
    if x.device.type == "cpu" and x.dim() == 2:
        if weight.dtype in HALF and weight.is_contiguous() and cpu_gemm.takes(x):
            y = cpu_gemm.matmul(x, cpu_gemm.dense_matrices([weight]))
        elif x.shape[0] == 1:
            y = torch.mv(weight.to(x.dtype), x[0]).unsqueeze(0)
        else:
            return F.linear(x, weight.to(x.dtype), bias)
        return y if bias is None else y + bias
    rows = x.reshape(-1, x.shape[-1])
    if use_triton(x) and rows.shape[0] <= tuning.GEMV_ROWS and weight.dtype == x.dtype and weight.stride(-1) == 1:
        from speclite.kernels import dense_triton

        return dense_triton.dense_gemm(rows, weight, bias).reshape(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight.to(x.dtype), bias)
