"""`eagle3`: an EAGLE-3 head (SpecForge or vLLM speculators layout, --draft DIR) drafts from the target's states.

Registered as `eagle3` (vLLM's `{"method": "eagle3"}` too) with SGLang's tree knobs; a chain of K is
steps K and topk 1 (the default, with K from --gen-num-per-cycle).
"""

from __future__ import annotations

from pathlib import Path

from speclite.errors import SpecliteError
from speclite.speculate.eagle3.head import Eagle3Head
from speclite.speculate.eagle3.load import load_head
from speclite.speculate.eagle3.proposer import Eagle3Proposer
from speclite.speculate.registry import BuildContext, Method, Option, register

__all__ = ["Eagle3Head", "Eagle3Proposer", "load_draft", "load_head"]


def load_draft(head_dir: str | Path, target, quant: str | None = None) -> Eagle3Head:
    """The head for `target` (its device and dtype), quantized at load like any draft (--draft-quant)."""
    weight = target.model.embed_tokens.weight  # embeddings stay high precision in every scheme
    head = load_head(head_dir, target.args, weight.device, weight.dtype)
    if quant:
        from speclite.quant import quantize_model

        quantize_model(head, quant)
    return head


def _check(options: dict) -> None:
    for name, low in (("eagle_topk", 1), ("eagle_steps", 1), ("eagle_num_draft_tokens", 2)):
        value = options[name]
        if value is not None and value < low:
            raise SpecliteError(f"--{name.replace('_', '-')} must be at least {low}, got {value}")


def _build(ctx: BuildContext) -> Eagle3Proposer:
    o = ctx.options
    head = load_draft(ctx.draft_dir, ctx.target, ctx.draft_quant)
    return Eagle3Proposer(head, ctx.target.model.embed_tokens, ctx.max_len, ctx.target_vocab,
                          topk=o["eagle_topk"], steps=o["eagle_steps"], num_draft_tokens=o["eagle_num_draft_tokens"])


register(Method(
    "eagle3", _build, "an EAGLE-3 head drafts a chain or a tree from the target's hidden states (--draft HEAD_DIR)",
    options=(
        Option("eagle_topk", int, 1, "EAGLE-3 tree: children per expanded node (1 = a chain)."),
        Option("eagle_steps", int, None, "EAGLE-3 tree: head passes, i.e. the tree's depth (default: the draft budget)."),
        Option("eagle_num_draft_tokens", int, None,
               "EAGLE-3 tree: tokens verified per pass, the last committed one included (default: k + 1)."),
    ),
    needs_draft=True, draft_is_model=False, needs_target=True, check=_check, in_default_sweep=False,
))
