"""`vanilla`: a smaller model of the same tokenizer drafts k tokens autoregressively."""

from __future__ import annotations

import torch

from speclite.sampling import argmax, sample, uniform, warp
from speclite.model import Transformer
from speclite.model.kv_cache import shared_prefix
from speclite.speculate.base import Proposal, Proposer, RequestContext
from speclite.speculate.registry import Method, register


def over_vocab(logits: torch.Tensor, v: int) -> torch.Tensor:
    """Draft logits [..., V'] over the target's vocabulary of v: Qwen-style checkpoints pad their
    vocabularies to different sizes, so extra rows are cut and missing ones can never be drafted."""
    if logits.shape[-1] >= v:
        return logits[..., :v]
    return torch.cat([logits, logits.new_full((*logits.shape[:-1], v - logits.shape[-1]), float("-inf"))], dim=-1)


def draw(logits: torch.Tensor, ctx: RequestContext) -> tuple[int, torch.Tensor | None]:
    """One draft from its logits: the argmax when greedy, else a sample from the warped
    distribution (returned too, for rejection sampling) with the request's generator."""
    if ctx.params.greedy:
        return argmax(logits), None
    q = warp(logits, ctx.params)
    return sample(q, uniform(ctx.generator)), q


class DraftModelProposer(Proposer):
    name = "vanilla"

    def __init__(self, model: Transformer, max_len: int, target_vocab: int):
        self.model = model
        self.cache = model.new_cache(max_len)
        self.target_vocab = target_vocab
        self.tokens: list[int] = []  # the sequence; its first cache.length tokens are in the cache
        self.drafts: list[int] = []

    def use_static(self) -> None:
        """Run the draft's fixed-shape steps as CUDA graphs (see speclite.model.static)."""
        from speclite.model.static import StaticDecoder

        self.model = StaticDecoder(self.model, self.cache)

    def resident(self) -> tuple[list, list]:
        return [self.model], [self.cache]

    def reset(self) -> None:
        self.tokens = []
        self.cache.rollback(0)

    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        self.ctx = ctx
        common = shared_prefix(self.tokens[: self.cache.length], prompt_ids)
        self.cache.rollback(common)
        self.tokens = list(prompt_ids)

    def _next_logits(self, tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor(tokens, device=self.ctx.device)
        return over_vocab(self.model(ids, self.cache, num_logits=1)[-1], self.target_vocab)

    def propose(self, k: int) -> Proposal:
        if self.cache.length >= len(self.tokens):
            self.cache.rollback(len(self.tokens) - 1)  # the last token's logits are needed again
        pending = self.tokens[self.cache.length :]
        k = min(k, self.cache.max_len - self.cache.length - len(pending) + 1)
        self.drafts, probs = [], []
        with torch.inference_mode():
            logits = self._next_logits(pending)
            for i in range(k):
                token, q = draw(logits, self.ctx)
                self.drafts.append(token)
                if q is not None:
                    probs.append(q)
                if i == k - 1:
                    break
                # Greedy: the rest of the chain in one call where the model can (the same tokens).
                chain = self.ctx.params.greedy and getattr(self.model, "greedy_chain", None)
                rest = chain and chain(token, self.cache, k - 1 - i, self.target_vocab)
                if rest:
                    self.drafts += rest
                    break
                logits = self._next_logits([token])
        return Proposal(self.drafts, torch.stack(probs) if probs else None)

    def observe(self, tokens: list[int], states=None) -> None:
        # The cache holds the sequence plus the drafts fed back in (or lags it, when no drafts
        # were asked for): keep the drafts the target kept.
        fed = self.cache.length - len(self.tokens)
        kept = 0
        while kept < min(fed, len(tokens)) and self.drafts[kept] == tokens[kept]:
            kept += 1
        self.cache.rollback(min(self.cache.length, len(self.tokens) + kept))
        self.tokens.extend(tokens)


register(Method(
    "vanilla", lambda ctx: DraftModelProposer(ctx.draft, ctx.max_len, ctx.target_vocab),
    "a smaller model of the same tokenizer drafts k tokens (--draft)",
    needs_draft=True, aliases=("draft_model", "draft"),
))
