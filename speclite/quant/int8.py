"""INT8 per-output-channel symmetric weights (compressed-tensors "int-quantized", strategy channel)."""

from __future__ import annotations

import torch


def quantize_int8_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K], weight_scale float32 [N, 1]) with w ~= q * scale."""
    w = weight.to(torch.float32, copy=True)  # rounded in place below
    wmin, wmax = torch.aminmax(w, dim=1, keepdim=True)
    amax = torch.maximum(-wmin, wmax)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = w.div_(scale).round_().clamp_(-127, 127).to(torch.int8)
    return q, scale

