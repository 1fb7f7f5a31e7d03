"""The DFlash drafter (block diffusion, arXiv 2602.06036): Qwen3 layers over the target's own states.

One forward drafts a whole block. The target's states of committed positions (the outputs of
`target_layers`, concatenated) are fused by `fc` + `hidden_norm` into one context row per
position; every layer projects that same row to keys/values (its own k_proj, k_norm, v_proj, RoPE
at the row's position) and keeps them in its cache, so the context is computed once per position
and never again. The block is [last committed token, mask, ..., mask] embedded by the target's
embedding at the positions after the context; its rows run through the layers as ordinary
pre-norm blocks whose attention sees every context entry and every block row (no causal mask).
Row i >= 1 of the block, after `norm` and the target's lm_head, predicts the token at its own
position. The drafter has no embedding or head of its own.

Submodule names follow the checkpoint's under `model.` (model.layers.N.*, model.fc, ...), so
speclite.quant.quantize_model quantizes the layers' linears like any draft's.
"""

from __future__ import annotations

import torch
from torch import nn

from speclite.kernels import cpu_gemm, cpu_layer_ops
from speclite.model.decoder import Block, Linear, ModelArgs, RMSNorm, project, rope_inv_freq, rope_rows, rotate
from speclite.model.kv_cache import KVCache


class DFlashLayer(Block):
    def inject(self, context: torch.Tensor, cos, sin, layer_cache, start: int) -> None:
        """Write the keys/values of fused context rows at cache slots start.. (no query: they are not outputs)."""
        attn, t = self.self_attn, context.shape[0]
        kv = project(context, attn.k_proj, attn.v_proj)
        if attn.cpu_attention_applies(kv, layer_cache[0]) and not cpu_gemm.needs_grad(kv):
            # The attention kernel with no query heads: k norm, RoPE and the cache write only.
            cpu_layer_ops.attention(kv, cos, sin, *layer_cache, 0, attn.num_kv_heads, start, start + t, None,
                                    *attn.qk_norm_weights())
            return
        k, v = kv.view(t, 2 * attn.num_kv_heads, attn.head_dim).split(attn.num_kv_heads, dim=1)
        if attn.qk_norm:
            k = attn.k_norm(k)
        cache_k, cache_v = layer_cache
        cache_k[:, start : start + t] = rotate(k, cos, sin).transpose(0, 1)
        cache_v[:, start : start + t] = v.transpose(0, 1)


class DFlashBody(nn.Module):
    def __init__(self, args: ModelArgs, fused_width: int):
        super().__init__()
        self.layers = nn.ModuleList(DFlashLayer(args) for _ in range(args.num_layers))
        self.fc = Linear(fused_width, args.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class DFlashDraft(nn.Module):
    def __init__(self, args: ModelArgs, target_layers: tuple[int, ...], block_size: int, mask_token: int):
        super().__init__()
        self.args = args
        self.target_layers = target_layers  # target layers whose outputs are concatenated, in this order
        self.block_size, self.mask_token = block_size, mask_token
        self.model = DFlashBody(args, len(target_layers) * args.hidden_size)
        self.inv_freq, self.rope_scale = None, 1.0

    def init_rope(self, device) -> None:
        inv_freq, self.rope_scale = rope_inv_freq(self.args)
        self.inv_freq = inv_freq.to(device)

    def new_cache(self, max_len: int) -> KVCache:
        a, p = self.args, self.model.norm.weight  # a norm stays high precision when the linears are quantized
        return KVCache(a.num_layers, a.num_kv_heads, max_len, a.head_dim, p.dtype, p.device)

    def kernel_decoder(self, x: torch.Tensor, cache: KVCache, embed: nn.Module, lm_head: nn.Module,
                       vocab_map: torch.Tensor | None = None) -> tuple | None:
        """For speclite_dflash_iterations: (the drafter as a C Decoder of activations like x: its layers, its
        norm with the target's lm_head as the head (or its rows of the tokens vocab_map lists), the
        target's embedding, its cache and RoPE rows;
        each layer's k/v projections; fc; hidden_norm), or None where the kernels do not take all of
        it, or a hook must fire or a gradient flow."""
        body, cache_k = self.model, cache.layers[0][0]
        if not (x.dim() == 2 and cache_k.dtype == x.dtype and cpu_layer_ops.takes(x)) or type(embed) is not nn.Embedding:
            return None
        modules = [body, embed, lm_head]

        def build():
            blocks = body.layers
            built = [b.build_cpu_layer(x) if b.cpu_layer_applies(x, cache_k) else None for b in blocks]
            kv = [cpu_gemm.module_matrices(x, [b.self_attn.k_proj, b.self_attn.v_proj]) for b in blocks]
            head = cpu_gemm.module_matrices(x, [lm_head])
            fuse = cpu_gemm.module_matrices(x, [body.fc])
            if (None in built or None in kv or head is None or fuse is None
                    or any(n.weight.dtype != x.dtype for n in (body.norm, body.hidden_norm))):
                return None
            layers = cpu_layer_ops.Layers(built, [m for b in modules for m in b.modules()],
                                          cpu_layer_ops.Head(head, body.norm.weight, body.norm.eps))
            return layers, kv, fuse

        found = cpu_gemm.cached(self, modules, build, deep=True)
        if found is None or any(found[0].hooks) or cpu_gemm.needs_grad(x, modules):
            return None
        layers, kv, fuse = found
        cos, sin = rope_rows(self, slice(0, cache.max_len), cache.max_len, x.dtype, x.device)
        return cpu_layer_ops.Decoder(layers, embed.weight, cache.layers, cos, sin, vocab_map), kv, fuse, body.hidden_norm

    def fuse(self, states: torch.Tensor) -> torch.Tensor:
        """[T, len(target_layers) * H] concatenated target states -> [T, H] context rows."""
        return self.model.hidden_norm(self.model.fc(states))

    def forward(self, context: torch.Tensor, embeds: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The block's normed outputs [B, H].

        `context` [C, H]: fused rows of positions cache.length.., which join the cache; `embeds`
        [B, H]: the block at the C positions after them. The block's own entries are written past
        the context and left outside cache.length, to be overwritten by the next block.
        """
        c0, c, b = cache.length, context.shape[0], embeds.shape[0]
        cos, sin = rope_rows(self, slice(c0, c0 + c + b), cache.max_len, embeds.dtype, embeds.device)
        # The block sees every cache entry and all of itself (attention kernels read no mask as causal).
        sees = torch.ones(b, c0 + c + b, dtype=torch.bool, device=embeds.device)
        x = embeds
        for layer, layer_cache in zip(self.model.layers, cache.layers):
            if c:
                layer.inject(context, cos[:c], sin[:c], layer_cache, c0)
            x = layer(x, cos[c:], sin[c:], layer_cache, c0 + c, sees)
        cache.length = c0 + c
        return self.model.norm(x)
