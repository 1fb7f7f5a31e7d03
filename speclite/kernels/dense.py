"""The dense linear layer: speclite's own CPU kernels where they apply, torch elsewhere.

On the CPU, bf16/f16 weights go through our kernels (cpu_gemm) for any number of rows (decode,
verification, prefill); they compute a row the same way whatever the other rows are, so verifying
k+1 tokens gives exactly the logits of k+1 single-token steps. Without them, one row goes through
torch.mv (measured ~30-45% faster than the general matmul for a single row).
"""

import torch
import torch.nn.functional as F

from speclite.kernels import cpu_gemm

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
    return F.linear(x, weight.to(x.dtype), bias)
