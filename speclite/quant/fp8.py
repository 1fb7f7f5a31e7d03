"""FP8 (e4m3) per-block weights: the DeepSeek-V3 / Qwen3-FP8 on-disk format.

A weight [N, K] is cut into block_n x block_k tiles (edge tiles are partial); each tile stores
float8_e4m3fn values and one float32 `weight_scale_inv` so that tile = value * scale.
"""

from __future__ import annotations

from concurrent.futures import Executor

import torch

from speclite.kernels.exact import quotient
from speclite.quant.rows import row_slices, run_chunks

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


def quantize_fp8_blocks(weight: torch.Tensor, block: tuple[int, int] = (128, 128),
                        pool: Executor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] float -> (fp8 [N, K], weight_scale_inv float32 [ceil(N/bn), ceil(K/bk)]).

    Per band of whole block rows: one float32 copy, zero-padded up to whole blocks (edge tiles are
    partial), scaled in place while it is in cache.
    """
    bn, bk = block
    n, k = weight.shape
    nb, kb = -(-n // bn), -(-k // bk)
    on = weight.device  # a GPU's weights quantize there (see int4._rtn)
    values, scale = torch.empty(n, k, dtype=FP8, device=on), torch.empty(nb, kb, device=on)

    def chunk(rows: slice) -> None:
        m = rows.stop - rows.start
        mb = -(-m // bn)
        w = torch.zeros(mb * bn, kb * bk, device=on) if (mb * bn, kb * bk) != (m, k) else torch.empty(m, k, device=on)
        w[:m, :k] = weight[rows]
        tiles = w.view(mb, bn, kb, bk)
        amax = torch.maximum(tiles.amax(dim=(1, 3)), -tiles.amin(dim=(1, 3)))  # max |w| without a copy
        # An all-zero tile gets scale 1 so it stays exactly zero and the scale stays finite.
        s = torch.where(amax > 0, quotient(amax, FP8_MAX), torch.ones_like(amax))
        tiles.div_(s[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX)
        values[rows] = w[:m, :k]
        scale[rows.start // bn: rows.start // bn + mb] = s

    run_chunks(chunk, row_slices(n, kb * bk, bn), pool)
    return values, scale


def dequantize_fp8_blocks(values: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype) -> torch.Tensor:
    """The format's definition: every tile times its scale; a single scale means per-tensor."""
    n, k = values.shape
    scale = scale_inv.float()
    if scale.numel() == 1:
        return (values.float() * scale.reshape(())).to(dtype)
    full = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:n, :k]
    return (values.float() * full).to(dtype)
