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
    (--draft-quant BODY: it has no head; a HEAD scheme is for its copy of the target's, _build)."""
    device, dtype = target.model.norm.weight.device, target.dtype  # the activations' (a table may be 16-bit)
    draft = load_drafter(draft_dir, target.args, device, dtype, mask_token)
    if quant:
        from speclite.quant import quantize_model

        quantize_model(draft, quant)
    return draft


def _build(ctx: BuildContext) -> DFlashProposer:
    draft = load_draft(ctx.draft_dir, ctx.target, ctx.body_quant, ctx.options["mask_token_id"])
    # A map's rows of the target's head, or a quantized copy of them (HEAD of --draft-quant BODY/HEAD).
    head, tokens = token_map.drafting_head(ctx.target.lm_head, None, token_map.tokens(ctx), ctx.head_quant,
                                           ctx.target.dtype, "the target")
    return DFlashProposer(draft, ctx.target.model.embed_tokens, head, ctx.max_len, tokens,
                          own_head=head is not ctx.target.lm_head)


def _block_drafts(proposer) -> int:
    """A block holds the last committed token and its drafts."""
    return proposer.draft.block_size - 1


register(Method(
    "dflash", _build, "a DFlash drafter proposes a block of k drafts in one forward from the target's states (--draft DIR)",
    options=(MASK_TOKEN, token_map.TOKEN_MAP), needs_draft=True, draft_is_model=False, needs_target=True,
    in_default_sweep=False, default_k=_block_drafts, max_k=_block_drafts, random_draft=random_drafter,
))
