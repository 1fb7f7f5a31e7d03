"""`eagle3`: an EAGLE-3 head (SpecForge or vLLM speculators layout, --draft DIR) drafts from the target's states.

Registered as `eagle3` (vLLM's `{"method": "eagle3"}` too) with SGLang's tree knobs (eagle_tree.py).
"""

from __future__ import annotations

from pathlib import Path

from speclite.speculate.eagle3.head import Eagle3Head
from speclite.speculate.eagle3.load import load_head
from speclite.speculate.eagle3.proposer import Eagle3Proposer
from speclite.speculate.eagle3.save import random_head
from speclite.speculate import token_map
from speclite.speculate.eagle_tree import TREE_OPTIONS, budget, check_tree, tree_args
from speclite.speculate.registry import BuildContext, Method, register

__all__ = ["Eagle3Head", "Eagle3Proposer", "load_draft", "load_head"]


def load_draft(head_dir: str | Path, target, quant: str | None = None) -> Eagle3Head:
    """The head for `target` (its device and dtype), quantized at load like any draft (--draft-quant)."""
    device, dtype = target.model.norm.weight.device, target.dtype  # the activations' (a table may be 16-bit)
    head = load_head(head_dir, target.args, device, dtype)
    if quant:
        from speclite.quant import quantize_model

        quantize_model(head, quant)
    return head


def _build(ctx: BuildContext) -> Eagle3Proposer:
    head = load_draft(ctx.draft_dir, ctx.target, ctx.body_quant)
    head.draft_through(token_map.tokens(ctx), ctx.head_quant, ctx.target.dtype)
    return Eagle3Proposer(head, ctx.target.model.embed_tokens, ctx.max_len, ctx.target_vocab, **tree_args(ctx.options))


register(Method(
    "eagle3", _build, "an EAGLE-3 head drafts a chain or a tree from the target's hidden states (--draft HEAD_DIR)",
    options=(*TREE_OPTIONS, token_map.TOKEN_MAP),
    needs_draft=True, draft_is_model=False, needs_target=True, check=check_tree, in_default_sweep=False,
    random_draft=random_head, default_k=budget, max_k=budget,
))
