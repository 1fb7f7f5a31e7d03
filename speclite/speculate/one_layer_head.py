"""What every one-block drafting head shares (EAGLE-3's layer, an MTP module): its RoPE and KV cache,
and on the CPU its steps in one C call each (several rows at once, or a whole greedy chain)."""

from __future__ import annotations

import torch
from torch import nn

from speclite.kernels import cpu_gemm, cpu_layer_ops
from speclite.kernels.dense import HALF
from speclite.model.decoder import ModelArgs, attended, hooked, over_tokens, rope_inv_freq, rope_rows
from speclite.model.kv_cache import KVCache
from speclite.speculate import token_map


class OneLayerHead(nn.Module):
    """A head of one decoder block (`self.model`, with a final `norm`) over the target's states."""

    args: ModelArgs
    model: nn.Module
    target_ids: torch.Tensor  # head vocabulary id -> target token id
    normed_state = False  # the next step's state is the norm's output (MiMo's MTP), not the layer's
    zeroes_position_0 = False  # the embedding paired with position 0 is zeroed (MTP, as vLLM does)
    full_vocab = False  # the head's rows are the target's tokens in order (an MTP module's)

    def output_head(self) -> nn.Module:
        return self.lm_head

    def to_target(self, logits: torch.Tensor, target_vocab: int) -> torch.Tensor:
        """Head-vocabulary logits [..., Vh] -> target-vocabulary logits [..., V] (-inf where the head has no token)."""
        return logits if self.full_vocab else over_tokens(logits, self.target_ids, target_vocab)

    def draft_through(self, keep: torch.Tensor | None, scheme: str, dtype: torch.dtype) -> None:
        """Draft through the head's rows of the tokens of `keep` only (--token-map), and/or a copy of the
        head quantized to `scheme` (HEAD of --draft-quant BODY/HEAD) from its `dtype` weights: the
        head's own, or the target's that an MTP module reads (the copy becomes the module's own)."""
        if keep is None and not scheme:
            return
        what = "the head" if self.lm_head is not None else "the target"
        self.lm_head, self.target_ids = token_map.drafting_head(self.output_head(), self.target_ids, keep, scheme,
                                                                dtype, what)
        self.full_vocab = self.full_vocab and keep is None

    def layer_struct(self, x: torch.Tensor) -> cpu_layer_ops.Layer | None:
        """The block as a cpu_layer_ops.Layer (reading a state and an embedding) for activations like x,
        or None where the kernels do not take it."""
        return None

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

    def cpu_layers(self, x: torch.Tensor) -> cpu_layer_ops.Layers | None:
        """The block, norm and head as one C call's structs (built once; hooks and gradients checked per
        call), where the kernels take every part in x's dtype."""
        layer, norm, head = self.model.layers[0], self.model.norm, self.output_head()
        if not cpu_layer_ops.takes(x) or x.dim() != 2:
            return None

        def build():
            struct = self.layer_struct(x) if norm.weight.dtype == x.dtype else None
            mats = None if struct is None else cpu_gemm.module_matrices(x, [head])
            if mats is None:
                return None
            return cpu_layer_ops.Layers([struct], [*layer.modules(), norm, head], cpu_layer_ops.Head(mats, norm.weight, norm.eps))

        built = cpu_gemm.cached(self, [layer, norm, head], build, deep=True)
        if built is None or any(built.hooks) or cpu_gemm.needs_grad(x, [layer, norm, head]):
            return None
        return built

    def fused(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache,
              mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(logits, normed states, the block's outputs) of T rows appended at cache.length (as run_layer,
        the norm and the head give them) in one C call; None where the kernels do not take the head."""
        layers = self.cpu_layers(hidden) if embeds.dtype == hidden.dtype else None
        if layers is None:
            return None
        t, start = hidden.shape[0], cache.length
        cos, sin = rope_rows(self, positions, cache.max_len, hidden.dtype, hidden.device)
        # No mask: causal over the cache, the kernels' reading (run_layer builds it for several rows).
        out, _, (normed, logits) = cpu_layer_ops.decoder_layers(
            layers, hidden, cos, sin, cache.layers, *attended(start, t, cache.layers[0][0]), mask, logit_rows=t,
            final=True, embeds=embeds)
        cache.length = start + t
        return logits, normed, out

    def greedy_chain(self, tokens: list[int], states: torch.Tensor, cache: KVCache, steps: int,
                     embed: nn.Module) -> list[int] | None:
        """`steps` greedy drafts: first the rows of `tokens` fed with `states` [T, H] at cache.length..
        (the pending pairs), then each draft fed with the step's state (the target ids of the argmaxes,
        as the head's steps one by one give them), in one C call on the CPU; None where the kernels do
        not take the whole head, or a hook, a gradient or an embedding of another dtype (but a 16-bit
        table under float32 states) asks for the steps one by one, or the rows start at position 0 of a
        head that zeroes that embedding."""
        start, t = cache.length, len(tokens)
        widened = states.dtype == torch.float32 and embed.weight.dtype in HALF  # a narrowed table (exact)
        if (type(embed) is not nn.Embedding or not (embed.weight.dtype == states.dtype or widened)
                or hooked([embed]) or cache.layers[0][0].dtype != states.dtype or start + t + steps - 1 > cache.max_len
                or (start == 0 and self.zeroes_position_0)):
            return None
        layers = self.cpu_layers(states)
        if layers is None:
            return None
        cos, sin = rope_rows(self, slice(start, start + t + steps - 1), cache.max_len, states.dtype, states.device)
        drafts = cpu_layer_ops.head_chain(layers.layers[0], layers.head, embed.weight, self.target_ids, tokens, states,
                                          cache.layers[0], start, cos, sin, steps, self.normed_state)
        cache.length = start + t + steps - 1
        return drafts
