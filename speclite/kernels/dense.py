"""The dense linear layer's torch path, with the one-row CPU case as a matrix-vector product.

Measured on this project's 2-core CPU: torch.mv streams bf16 weights ~30-45% faster than the
general matmul for a single row, and decode at batch 1 is nothing but such rows. For bf16, our own
AVX-512 BF16 kernel (cpu_gemv) streams them ~9% faster again (benchmarks/cpu_gemv.py).
"""

import torch
import torch.nn.functional as F

from speclite.kernels import cpu_gemv


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if x.dim() == 2 and x.shape[0] == 1 and x.device.type == "cpu":
        if _own_gemv(x, weight):
            y = cpu_gemv.gemv_bf16(x[0].contiguous(), weight).to(torch.bfloat16).unsqueeze(0)
        else:
            y = torch.mv(weight, x[0]).unsqueeze(0)
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


def _own_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.dtype == weight.dtype == torch.bfloat16 and weight.shape[1] % 32 == 0
            and weight.is_contiguous() and cpu_gemv.available())
