"""GPTQ (Frantar et al., 2022): 4-bit group quantization with second-order error feedback.

Columns are quantized one at a time; each column's rounding error is spread over the columns not
yet quantized through the inverse Hessian of the layer's reconstruction loss (H = 2 X^T X over
calibration activations), so later columns absorb earlier mistakes. With act_order, columns are
visited in decreasing diag(H) (most-used input channels first) and g_idx records each channel's
group. Implemented here directly (no GPTQModel dependency).
"""

from __future__ import annotations

import torch

from speclite.quant.int4 import Int4Weight, group_params, quantize_values


class HessianAccumulator:
    """Running H = 2/n * sum x x^T over the rows fed to one linear."""

    def __init__(self, k: int, device):
        self.h = torch.zeros(k, k, dtype=torch.float32, device=device)
        self.n = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        m = x.shape[0]
        self.h *= self.n / (self.n + m)
        self.n += m
        x = x * (2 / self.n) ** 0.5
        self.h += x.t() @ x


def gptq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    group_size: int,
    sym: bool,
    act_order: bool = False,
    damp: float = 0.01,
) -> Int4Weight:
    w = weight.float().clone()
    n, k = w.shape
    h = hessian.float().clone()
    dead = torch.diag(h) == 0  # channels never active: weight irrelevant, keep H invertible
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k, device=w.device)
    w, h = w[:, perm], h[perm][:, perm]
    h += damp * torch.mean(torch.diag(h)) * torch.eye(k, device=w.device)
    # Upper Cholesky factor of H^-1: row i holds the update coefficients for columns >= i.
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)

    groups = -(-k // group_size)
    q = torch.zeros(n, k, dtype=torch.uint8, device=w.device)
    scales = torch.zeros(groups, n, device=w.device)
    zeros = torch.zeros(groups, n, device=w.device)
    # Blocks are whole groups, so a group's range is taken from fully updated columns.
    block = group_size * max(1, 128 // group_size)
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        wb = w[:, b0:b1].clone()
        err = torch.zeros_like(wb)
        hb = hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            if col % group_size == 0:
                g = col // group_size
                scale, zero = group_params(wb[:, i : i + group_size], sym)
                scales[g], zeros[g] = scale, zero
            qi = quantize_values(wb[:, i], scale, zero)
            q[:, col] = qi.to(torch.uint8)
            e = (wb[:, i] - (qi - zero) * scale) / hb[i, i]
            wb[:, i:] -= e[:, None] * hb[i, i:][None, :]
            err[:, i] = e
        w[:, b1:] -= err @ hinv[b0:b1, b1:]

    inv = torch.argsort(perm)
    g_idx = (torch.arange(k, device=w.device) // group_size)[inv]
    return Int4Weight(
        q=q[:, inv].contiguous().cpu(),
        zeros=zeros.to(torch.uint8).cpu(),
        scales=scales.half().cpu(),
        g_idx=g_idx.to(torch.int32).cpu(),
        group_size=group_size,
    )
