"""Medusa heads: from the target's final normed state, head i predicts the token i + 2 places ahead.

Head i is `num_layers` residual blocks x + SiLU(W x + b) and an lm_head (no bias): its own, or the
target's (vLLM's `original_lm_head` with no head in the checkpoint). The target's own logits give
the next token; head 0 guesses the one after it, head 1 the one after that, and so on. Submodule
names: heads.{i}.layers.{j}, heads.{i}.lm_head (load.py maps both published layouts onto them);
each head's `lm_head` is what --draft-quant quantizes (heads sharing the target's: one quantized copy).
"""

from __future__ import annotations

import torch
from torch import nn

from speclite.model.decoder import Linear, ModelArgs, over_tokens
from speclite.speculate import token_map


class MedusaHead(nn.Module):
    def __init__(self, hidden: int, vocab: int, num_layers: int, bias: bool, own_head: bool = True):
        super().__init__()
        self.layers = nn.ModuleList([Linear(hidden, hidden, bias=bias) for _ in range(num_layers)])
        self.lm_head = Linear(hidden, vocab, bias=False) if own_head else None

    def blocks(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class MedusaHeads(nn.Module):
    def __init__(self, args: ModelArgs, num_heads: int, num_layers: int, bias: bool, own_head: bool = True):
        super().__init__()
        self.args = args  # the target's: the heads read its final state and predict over its vocabulary
        self.heads = nn.ModuleList([MedusaHead(args.hidden_size, args.vocab_size, num_layers, bias, own_head)
                                    for _ in range(num_heads)])
        self.shared: list[nn.Module] = []  # the target's lm_head when the heads have none: not a
        # submodule, so --draft-quant and memory reports leave the target's weights alone
        self.vocab_map: torch.Tensor | None = None  # (--token-map) the tokens of the heads' rows

    def __len__(self) -> int:
        return len(self.heads)

    def draft_through(self, keep: torch.Tensor | None, scheme: str | None, dtype: torch.dtype) -> None:
        """Draft the tokens of `keep` only (--token-map): each head's rows of them; and/or through
        lm_heads quantized to `scheme` (--draft-quant) from their `dtype` weights. Heads sharing the
        target's lm_head share one copy of its rows or its quantized weights (the heads' own: `rows`)."""
        if keep is None and not scheme:
            return
        if self.shared:
            self.rows, self.vocab_map = token_map.drafting_head(self.shared[0], None, keep, scheme, dtype, "the target")
            self.shared = [self.rows]
            return
        for i, head in enumerate(self.heads):
            head.lm_head, self.vocab_map = token_map.drafting_head(head.lm_head, None, keep, scheme, dtype,
                                                                   f"Medusa head {i}")

    def forward(self, state: torch.Tensor, n: int | None = None) -> torch.Tensor:
        """Logits [n, ..., V] of the first n heads (all by default) for final states [..., H]."""
        states = [head.blocks(state) for head in self.heads[:n]]
        if self.shared:  # one product over every head's rows
            logits = self.shared[0](torch.stack(states))
        else:
            logits = torch.stack([head.lm_head(x) for head, x in zip(self.heads, states)])
        return logits if self.vocab_map is None else over_tokens(logits, self.vocab_map, self.args.vocab_size)
