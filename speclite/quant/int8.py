"""INT8 per-output-channel symmetric weights (compressed-tensors "int-quantized", strategy channel)."""

from __future__ import annotations

from concurrent.futures import Executor

import torch

from speclite.quant.rows import row_slices, run_chunks


def quantize_int8_channel(weight: torch.Tensor, pool: Executor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K], weight_scale float32 [N, 1]) with w ~= q * scale, on weight's device."""
    n, k = weight.shape
    q = torch.empty(n, k, dtype=torch.int8, device=weight.device)
    scale = torch.empty(n, 1, device=weight.device)

    def chunk(rows: slice) -> None:
        w = weight[rows].to(torch.float32, copy=True)  # rounded in place below
        # amin and amax: two passes over a chunk in cache, faster than torch.aminmax's one.
        amax = torch.maximum(-w.amin(1, keepdim=True), w.amax(1, keepdim=True))
        s = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        q[rows] = w.div_(s).round_().clamp_(-127, 127)
        scale[rows] = s

    run_chunks(chunk, row_slices(n, k), pool)
    return q, scale
