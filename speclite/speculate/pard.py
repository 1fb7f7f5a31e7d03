"""`pard`: a parallel draft model (PARD, arXiv 2504.18583) proposes all k drafts in one forward.

The draft is an ordinary small decoder adapted to read k-1 mask tokens after the last real one:
one forward over the committed tokens it has not seen yet plus the masks, at consecutive positions
with ordinary causal attention (as vLLM's `parallel_drafting` and TensorRT-LLM's PARD worker run
it), gives the k drafts from the logits of the last real token and of each mask. Its KV cache
keeps only the real tokens: the masks' entries are dropped right after the forward, so between
iterations the cache is a prefix of the committed sequence and nothing needs rolling back on
observe. Each draft's distribution does not depend on the drafts before it, which rejection
sampling allows (any proposal distribution keeps the target's).
"""

from __future__ import annotations

from pathlib import Path

import torch

from speclite.errors import SpecliteError
from speclite.model import Transformer
from speclite.model.loader import read_config
from speclite.speculate import token_map
from speclite.speculate.base import Proposal
from speclite.speculate.draft_model import DraftModelProposer, draw_rows, over_vocab
from speclite.speculate.registry import BuildContext, Method, Option, register

# Where checkpoints name their mask token: amd/PARD-* (and vLLM) `pard_token`, TensorRT-LLM `mask_token_id`.
CONFIG_KEYS = ("pard_token", "mask_token_id")
# Shared with dflash (one option of one name): the mask token the draft's block is filled with.
MASK_TOKEN = Option("mask_token_id", int, None, "PARD / DFlash: the draft's mask token id (default: its config.json "
                    "pard_token or mask_token_id; DFlash: dflash_config.mask_token_id).")


class ParallelDraftProposer(DraftModelProposer):
    name = "pard"

    def __init__(self, model: Transformer, max_len: int, target_vocab: int, mask_token: int):
        super().__init__(model, max_len, target_vocab)
        self.mask_token = mask_token

    def propose(self, k: int) -> Proposal:
        if self.cache.length >= len(self.tokens):
            self.cache.rollback(len(self.tokens) - 1)  # the last token's logits are needed again
        committed = len(self.tokens)
        k = min(k, self.cache.max_len - committed + 1)
        if k < 1:
            return Proposal([])
        ids = torch.tensor(self.tokens[self.cache.length :] + [self.mask_token] * (k - 1), device=self.ctx.device)
        with torch.inference_mode():
            logits = over_vocab(self.model(ids, self.cache, num_logits=k), self.target_vocab)
            self.cache.rollback(committed)
            return draw_rows(logits, self.ctx)

    def observe(self, tokens: list[int], states=None) -> None:
        self.tokens.extend(tokens)  # the cache holds committed tokens only: the new ones go in next propose


def mask_token(option: int | None, draft_dir: Path, draft_vocab: int) -> int:
    """--mask-token-id, else the draft config's `pard_token` / `mask_token_id`; it must be a row of the draft's embedding."""
    token = option
    if token is None:
        cfg = read_config(draft_dir)
        token = next((cfg[key] for key in CONFIG_KEYS if cfg.get(key) is not None), None)
        if token is None:
            raise SpecliteError(f"PARD draft {draft_dir} names no mask token (config.json has no "
                                f"{' or '.join(CONFIG_KEYS)}): pass --mask-token-id")
    if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < draft_vocab:
        raise SpecliteError(f"PARD mask token {token!r} of {draft_dir} is not a token id of the draft "
                            f"(its vocabulary has {draft_vocab} rows)")
    return token


def _build(ctx: BuildContext) -> ParallelDraftProposer:
    token = mask_token(ctx.options["mask_token_id"], ctx.draft_dir, ctx.draft.args.vocab_size)
    return ParallelDraftProposer(token_map.draft_model(ctx), ctx.max_len, ctx.target_vocab, token)


register(Method(
    "pard", _build, "a PARD parallel draft model proposes all k drafts in one forward from k-1 mask tokens (--draft)",
    options=(MASK_TOKEN, token_map.TOKEN_MAP),
    needs_draft=True, vllm_flag=("vanilla", "parallel_drafting"),
    in_default_sweep=False,  # the default draft of a model is an ordinary one, without a mask token
))
