"""`mtp`: a multi-token-prediction module (DeepSeek-V3 or MiMo layout) drafts from the target's states.

The module comes from the target's own checkpoint, or from --draft DIR (a separate checkpoint),
quantized on its own with --draft-quant. Registered as `mtp` (vLLM's `{"method": "mtp"}` too) with
EAGLE-3's tree knobs, as SGLang runs MTP (eagle_tree.py).
"""

from __future__ import annotations

from pathlib import Path

from speclite.errors import SpecliteError
from speclite.speculate import token_map
from speclite.speculate.eagle_tree import TREE_OPTIONS, budget, check_tree, tree_args
from speclite.speculate.mtp.load import load_module
from speclite.speculate.mtp.module import MTPModule
from speclite.speculate.mtp.proposer import MTPProposer
from speclite.speculate.mtp.save import random_module
from speclite.speculate.registry import BuildContext, Method, register

__all__ = ["MTPModule", "MTPProposer", "load_draft", "load_module"]


def load_draft(module_dir: str | Path | None, target, quant: str | None = None) -> MTPModule:
    """The module of `module_dir`, or of the target's own checkpoint when None, quantized if asked."""
    in_target = module_dir is None
    if in_target:
        module_dir = target.checkpoint_dir
        if module_dir is None:
            raise SpecliteError("--sp-type mtp reads its module from the target's checkpoint directory, which this "
                                "target was not loaded from: pass the module with --draft DIR")
    module = load_module(module_dir, target, in_target)
    if quant:
        from speclite.quant import quantize_model

        quantize_model(module, quant)
    return module


def _build(ctx: BuildContext) -> MTPProposer:
    module = load_draft(ctx.draft_dir, ctx.target, ctx.body_quant)
    module.draft_through(token_map.tokens(ctx), ctx.head_quant, ctx.target.dtype)
    return MTPProposer(module, ctx.target.model.embed_tokens, ctx.max_len, ctx.target_vocab, **tree_args(ctx.options))


register(Method(
    "mtp", _build,
    "the target's multi-token-prediction module drafts a chain or a tree (its checkpoint's, or --draft DIR)",
    options=(*TREE_OPTIONS, token_map.TOKEN_MAP), check=check_tree, draft_is_model=False, draft_optional=True,
    needs_target=True,
    in_default_sweep=False, random_draft=random_module, default_k=budget, max_k=budget,
))
