"""A multi-token-prediction module: the target's state at t and the embedding of token t+1 -> token t+2.

One step for T rows: row i pairs a state (the target's final normed hidden state, or the module's
own output of the step before) with the embedding of the token that followed it. Both are RMS-
normed (`enorm` the embedding, `hnorm` the state), concatenated — [embedding, state] in DeepSeek-V3,
[state, embedding] in MiMo — and projected back to H by `eh_proj`; one decoder block of the
target's own kind (attention + MLP, with its own KV cache) follows, then the final norm and the
head (the module's own `shared_head.head`, else the target's lm_head).

What comes out as the state for the next step is each published implementation's output: the
block's output before the final norm in DeepSeek-V3, after it in MiMo (vLLM deepseek_mtp.py and
mimo_mtp.py; MiMo's own modelling feeds that normed output to its next MTP step and its lm_head).

Module names follow the DeepSeek-V3 checkpoint with the block at model.layers.0 (enorm, hnorm,
eh_proj beside self_attn.* and mlp.*), model.norm for the final norm, lm_head for the head, so
speclite.quant.quantize_model quantizes the block's linears like any draft's (eh_proj stays high
precision, as EAGLE-3's fc does).
"""

from __future__ import annotations

import torch
from torch import nn

from speclite.kernels import cpu_gemm, cpu_layer_ops
from speclite.kernels.cpu_threads import one_thread
from speclite.model.decoder import Block, Linear, ModelArgs, RMSNorm
from speclite.model.kv_cache import KVCache
from speclite.speculate.one_layer_head import OneLayerHead


class MTPLayer(Block):
    def __init__(self, args: ModelArgs, state_first: bool):
        super().__init__(args)
        h = args.hidden_size
        self.enorm = RMSNorm(h, args.rms_norm_eps)
        self.hnorm = RMSNorm(h, args.rms_norm_eps)
        self.eh_proj = Linear(2 * h, h, bias=False)
        self.state_first = state_first  # MiMo concatenates [state, embedding]

    def forward(self, embeds, hidden, cos, sin, layer_cache, start, mask):
        e, h = self.enorm(embeds), self.hnorm(hidden)
        x = self.eh_proj(torch.cat((h, e) if self.state_first else (e, h), dim=-1))
        return super().forward(x, cos, sin, layer_cache, start, mask)


class MTPBody(nn.Module):
    def __init__(self, args: ModelArgs, state_first: bool):
        super().__init__()
        self.layers = nn.ModuleList([MTPLayer(args, state_first)])
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class MTPModule(OneLayerHead):
    """The interface Eagle3Proposer drives: new_cache, forward -> (logits, state), to_target, target_ids."""

    zeroes_position_0 = True
    full_vocab = True  # the module predicts over the target's vocabulary itself (unless --token-map restricts it)

    def __init__(self, args: ModelArgs, own_head: bool, state_first: bool, normed_state: bool):
        super().__init__()
        self.args = args
        self.model = MTPBody(args, state_first)
        self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False) if own_head else None
        self.normed_state = normed_state  # MiMo: the final norm's output is the next step's state
        self.shared: list[nn.Module] = []  # the target's lm_head when the module has none: not a
        # submodule, so --draft-quant and memory reports leave the target's weights alone
        self.register_buffer("target_ids", torch.arange(args.vocab_size), persistent=False)
        self.inv_freq, self.rope_scale = None, 1.0

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [T, V], states [T, H]) for T rows appended at cache.length (`mask` as run_layer's)."""
        # vLLM (deepseek_mtp, mimo_mtp) zeroes the embedding paired with position 0, as in training.
        if self.zeroes_position_0:  # (a prompt's rows: on one thread, see kernels.cpu_threads)
            with one_thread(embeds.device):
                embeds = embeds.masked_fill((positions == 0)[:, None], 0)
        fused = self.fused(embeds, hidden, positions, cache, mask)
        if fused is not None:
            logits, normed, out = fused
        else:
            out = self.run_layer(embeds, hidden, positions, cache, mask)
            normed = self.model.norm(out)
            logits = self.output_head()(normed)
        return logits, normed if self.normed_state else out

    def output_head(self) -> nn.Module:
        return self.lm_head if self.lm_head is not None else self.shared[0]

    def layer_struct(self, x: torch.Tensor) -> cpu_layer_ops.Layer | None:
        layer = self.model.layers[0]
        if not layer.cpu_layer_applies(x, x) or any(n.weight.dtype != x.dtype for n in (layer.enorm, layer.hnorm)):
            return None
        in_proj = cpu_gemm.module_matrices(x, [layer.eh_proj])
        return None if in_proj is None else layer.build_cpu_layer(
            x, dict(hnorm=layer.hnorm.weight, enorm=layer.enorm.weight, in_proj=in_proj, state_first=layer.state_first))
