"""`medusa`: Medusa heads (FasterDecoding/Medusa or vLLM layout, --draft DIR) draft from the target's final state.

Registered as `medusa` (vLLM's `{"method": "medusa"}` too). By default a chain of each head's argmax
(sampled from the heads' distributions when sampling); `--medusa-topk` > 1 drafts a default tree of
the heads' top-k, `--medusa-tree` a given one.
"""

from __future__ import annotations

from pathlib import Path

from speclite.errors import SpecliteError
from speclite.speculate import token_map
from speclite.speculate.medusa.head import MedusaHeads
from speclite.speculate.medusa.load import load_heads
from speclite.speculate.medusa.proposer import MedusaProposer
from speclite.speculate.medusa.tree import parse_tree
from speclite.speculate.medusa.save import random_heads
from speclite.speculate.registry import BuildContext, Method, Option, register

__all__ = ["MedusaHeads", "MedusaProposer", "load_draft", "load_heads"]


def load_draft(head_dir: str | Path, target, quant: str | None = None, keep=None) -> MedusaHeads:
    """The heads for `target` (its device and dtype), over the tokens of `keep` only where given
    (--token-map), their lm_heads quantized to `quant` (--draft-quant): each head's own, or one copy of
    the target's that heads without their own share (the target keeps its own)."""
    device, dtype = target.model.norm.weight.device, target.dtype  # the activations' (a table may be 16-bit)
    heads = load_heads(head_dir, target.args, device, dtype)
    if heads.heads[0].lm_head is None:
        heads.shared.append(target.lm_head)
    heads.draft_through(keep, quant, dtype)
    return heads


def _check(options: dict) -> None:
    if options["medusa_topk"] < 1:
        raise SpecliteError(f"--medusa-topk must be at least 1, got {options['medusa_topk']}")
    if options["medusa_tree"] is not None:
        if options["medusa_topk"] != 1:
            raise SpecliteError("--medusa-tree gives the whole tree: leave --medusa-topk out")
        parse_tree(options["medusa_tree"])


def _build(ctx: BuildContext) -> MedusaProposer:
    o = ctx.options
    if ctx.head_quant:
        raise SpecliteError(f"--draft-quant {ctx.draft_quant}: Medusa heads take one scheme, their lm_heads' "
                            f"(--draft-quant {ctx.head_quant}), not BODY/HEAD")
    heads = load_draft(ctx.draft_dir, ctx.target, ctx.draft_quant, token_map.tokens(ctx))
    tree = parse_tree(o["medusa_tree"]) if o["medusa_tree"] is not None else None
    depth = max(map(len, tree)) if tree else 1
    width = 1 + max(max(p) for p in tree) if tree else o["medusa_topk"]
    if depth > len(heads):
        raise SpecliteError(f"--medusa-tree is {depth} levels deep but {ctx.draft_dir} has {len(heads)} heads")
    if width > ctx.target_vocab:
        raise SpecliteError(f"Medusa trees rank at most the vocabulary's {ctx.target_vocab} tokens, not {width}")
    return MedusaProposer(heads, o["medusa_topk"], tree)


register(Method(
    "medusa", _build, "Medusa heads draft a chain or a tree from the target's final hidden state (--draft HEAD_DIR)",
    options=(
        Option("medusa_topk", int, 1, "Medusa: top-k tokens per head in the default tree (1 = a chain of "
               "each head's best token)."),
        Option("medusa_tree", str, None, "Medusa tree: a JSON list of top-k rank paths as in Medusa's "
               "medusa_choices, e.g. [[0],[1],[0,0]], or a file holding one; the first k paths are verified."),
        token_map.TOKEN_MAP,
    ),
    needs_draft=True, draft_is_model=False, needs_target=True, check=_check, in_default_sweep=False,
    random_draft=random_heads, max_k=lambda proposer: proposer.most_drafts,
))
