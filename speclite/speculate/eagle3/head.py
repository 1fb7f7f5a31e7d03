"""The EAGLE-3 draft head: fc over the target's captured states, one decoder layer fed 2H inputs, its own lm_head.

One step for T rows: row i pairs a hidden state (the target's fused states, or the head's own
pre-norm output of the step before) with the embedding of the token that followed it. The layer
normalises both (`input_layernorm` for the embedding, `hidden_norm` for the state), concatenates
them [embedding, state] into q/k/v, adds the attention output to the (un-normed) state and runs
the MLP; `norm` + `lm_head` give logits over the draft vocabulary, mapped to target ids with
target_id = draft_id + d2t[draft_id]. The head has no embedding: the target's is passed in.

Submodule names follow vLLM's in-memory layout (model.fc, model.layers.0.*, model.norm, lm_head),
so speclite.quant.quantize_model quantizes the layer's linears like any draft's.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from speclite.kernels import cpu_layer_ops
from speclite.model.decoder import MLP, Attention, Block, Linear, ModelArgs, RMSNorm
from speclite.model.kv_cache import KVCache
from speclite.speculate.one_layer_head import OneLayerHead


class Eagle3Layer(nn.Module):
    def __init__(self, args: ModelArgs, norm_before_residual: bool):
        super().__init__()
        h = args.hidden_size
        # q/k/v read [embedding, state] (2H); the output projection writes back to H.
        self.self_attn = Attention(replace(args, hidden_size=2 * h))
        self.self_attn.o_proj = Linear(args.num_heads * args.head_dim, h, bias=args.o_bias)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(h, args.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, args.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    # Block's one-call plumbing reads only the attention, the MLP and the two norms this layer has
    # under the same names: its check, its modules and its Layer struct serve the head as they are.
    cpu_layer_applies = Block.cpu_layer_applies
    kernel_modules = Block.kernel_modules
    build_cpu_layer = Block.build_cpu_layer

    def forward(self, embeds, hidden, cos, sin, layer_cache, start: int, mask):
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        x = residual + self.self_attn(x, cos, sin, layer_cache, start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Body(nn.Module):
    def __init__(self, args: ModelArgs, fused_width: int, norm_before_residual: bool, norm_before_fc: bool):
        super().__init__()
        # gpt-oss heads normalise the concatenated target states before fc (`input_norm`).
        self.input_norm = RMSNorm(fused_width, args.rms_norm_eps) if norm_before_fc else None
        self.fc = Linear(fused_width, args.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(args, norm_before_residual)])
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class Eagle3Head(OneLayerHead):
    def __init__(self, args: ModelArgs, draft_vocab: int, fused_width: int, aux_layers: tuple[int, ...],
                 norm_before_residual: bool = False, norm_before_fc: bool = False):
        super().__init__()
        self.args = args
        self.aux_layers = aux_layers  # target layers whose inputs are concatenated, in this order
        self.model = Eagle3Body(args, fused_width, norm_before_residual, norm_before_fc)
        self.lm_head = Linear(args.hidden_size, draft_vocab, bias=False)
        self.register_buffer("target_ids", torch.arange(draft_vocab), persistent=False)
        self.inv_freq, self.rope_scale = None, 1.0

    def fuse(self, states: torch.Tensor) -> torch.Tensor:
        """[T, 3 * target hidden] concatenated target states -> [T, H], the layer's state input."""
        if self.model.input_norm is not None:
            states = self.model.input_norm(states)
        return self.model.fc(states)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [T, draft vocab], pre-norm states [T, H]) for T rows appended at cache.length
        (`mask` as OneLayerHead.run_layer's). On the CPU one C call where the kernels take the head."""
        fused = self.fused(embeds, hidden, positions, cache, mask)
        if fused is not None:
            return fused[0], fused[2]
        out = self.run_layer(embeds, hidden, positions, cache, mask)
        return self.lm_head(self.model.norm(out)), out

    def layer_struct(self, x: torch.Tensor) -> cpu_layer_ops.Layer | None:
        layer = self.model.layers[0]
        if not layer.cpu_layer_applies(x, x) or layer.hidden_norm.weight.dtype != x.dtype:
            return None
        return layer.build_cpu_layer(x, dict(hnorm=layer.hidden_norm.weight, residual_normed=layer.norm_before_residual))
