"""`dflash`: a DFlash block-diffusion drafter (z-lab/*-DFlash*, --draft DIR) drafts k tokens in one forward.

Registered as `dflash` (vLLM's and SGLang's name). It conditions on the target's states, embeds
with the target's embedding and reads logits through the target's lm_head; --draft-quant
quantizes its layers' linears like any draft's. k defaults to the drafter's block size - 1, the
mask slots of its trained block (SGLang's default block is the drafter's; the drafters' vLLM recipe
passes num_speculative_tokens = block size - 1), and is capped there: the drafter was trained on no
later slot, so a larger --gen-num-per-cycle drafts block size - 1, and `auto` adapts up to it.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from speclite.errors import SpecliteError
from speclite.model.decoder import Linear
from speclite.speculate.dflash.draft import DFlashDraft
from speclite.speculate.dflash.load import load_drafter
from speclite.speculate.dflash.proposer import DFlashProposer
from speclite.speculate.dflash.save import random_drafter
from speclite.speculate import token_map
from speclite.speculate.pard import MASK_TOKEN
from speclite.speculate.registry import BuildContext, Method, register

__all__ = ["DFlashDraft", "DFlashProposer", "load_draft", "load_drafter"]


def load_draft(draft_dir: str | Path, target, quant: str | None = None, mask_token: int | None = None) -> DFlashDraft:
    """The drafter for `target` (its device and dtype), its layers quantized at load like any draft's
    (--draft-quant BODY; a HEAD scheme is for its copy of the target's head, _build)."""
    device, dtype = target.model.norm.weight.device, target.dtype  # the activations' (a table may be 16-bit)
    draft = load_drafter(draft_dir, target.args, device, dtype, mask_token)
    if quant:
        from speclite.quant import quantize_model

        quantize_model(draft, quant.partition("/")[0])
    return draft


def _build(ctx: BuildContext) -> DFlashProposer:
    draft = load_draft(ctx.draft_dir, ctx.target, ctx.draft_quant, ctx.options["mask_token_id"])
    keep = token_map.tokens(ctx)
    head, tokens = (ctx.target.lm_head, None) if keep is None else token_map.restrict(
        ctx.target.lm_head, None, keep, "the target")
    if ctx.head_quant:  # drafting through a quantized copy of the target's head (or of the map's rows of it)
        head = quantized_head(head, ctx.head_quant, ctx.target.dtype)
    return DFlashProposer(draft, ctx.target.model.embed_tokens, head, ctx.max_len, tokens,
                          own_head=head is not ctx.target.lm_head)


def quantized_head(head, scheme: str, dtype) -> nn.Module:
    from speclite.quant.quantize import quantized_linear
    from speclite.quant.schemes import LOAD_TIME_SCHEMES, normalize_scheme

    if type(head) is not Linear:
        raise SpecliteError(f"--draft-quant BODY/{scheme}: DFlash drafts through a quantized copy of the target's "
                            "head, which is quantized already: name the body's scheme alone")
    dense = Linear.holding(head.weight.detach().to(dtype))  # the activations' dtype
    return quantized_linear(dense, normalize_scheme(scheme, LOAD_TIME_SCHEMES))


register(Method(
    "dflash", _build, "a DFlash drafter proposes a block of k drafts in one forward from the target's states (--draft DIR)",
    options=(MASK_TOKEN, token_map.TOKEN_MAP), needs_draft=True, draft_is_model=False, needs_target=True,
    in_default_sweep=False, default_k=lambda proposer: proposer.draft.block_size - 1, random_draft=random_drafter,
))
