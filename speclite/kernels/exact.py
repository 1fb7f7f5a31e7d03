"""Arithmetic that gives the same bits on every device."""

from __future__ import annotations

import torch


def quotient(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor, correctly rounded on any device. Given a Python number, CUDA torch multiplies by
    its reciprocal, an ulp off the quotient the CPU and the kernels compute (on an H200 the W8A8
    quantizer's scales, and so its int8 activations, differed from the kernel's)."""
    return x / torch.tensor(divisor, dtype=torch.float32, device=x.device)
