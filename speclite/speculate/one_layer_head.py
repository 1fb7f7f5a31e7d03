"""What every one-block drafting head shares (EAGLE-3's layer, an MTP module): its RoPE and KV cache."""

from __future__ import annotations

import torch
from torch import nn

from speclite.model.decoder import ModelArgs, rope_inv_freq, rope_rows
from speclite.model.kv_cache import KVCache


class OneLayerHead(nn.Module):
    """A head of one decoder block (`self.model`, with a final `norm`) over the target's states."""

    args: ModelArgs
    model: nn.Module

    def init_rope(self, device) -> None:
        inv_freq, self.rope_scale = rope_inv_freq(self.args)
        self.inv_freq = inv_freq.to(device)

    def new_cache(self, max_len: int) -> KVCache:
        a, p = self.args, self.model.norm.weight  # a norm stays high precision when the linears are quantized
        return KVCache(1, a.num_kv_heads, max_len, a.head_dim, p.dtype, p.device)

    def run_layer(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                  mask: torch.Tensor | None) -> torch.Tensor:
        """The block's output [T, H] for T rows appended at cache.length.

        `mask` [T, cache.length + T] (True = attend) lets tree rows see their ancestors only;
        None means causal over the cache (a single row, or the committed rows of a chain).
        """
        t, start = embeds.shape[0], cache.length
        if mask is None and t > 1:
            mask = torch.ones(t, start + t, dtype=torch.bool, device=embeds.device).tril(start)
        cos, sin = rope_rows(self, positions, cache.max_len, hidden.dtype, hidden.device)
        out = self.model.layers[0](embeds, hidden, cos, sin, cache.layers[0], start, mask)
        cache.length = start + t
        return out
