"""`vanilla`: a smaller model of the same tokenizer drafts k tokens autoregressively."""

from __future__ import annotations

import torch

from speclite.kernels import cpu_layer_ops
from speclite.model import Transformer
from speclite.model.kv_cache import shared_prefix
from speclite.sampling import Ahead, row_argmaxes, sample, uniform, warp
from speclite.speculate.base import Iteration, Proposal, Proposer, RequestContext
from speclite.speculate import token_map
from speclite.speculate.registry import Method, register


def over_vocab(logits: torch.Tensor, v: int) -> torch.Tensor:
    """Draft logits [..., V'] over the target's vocabulary of v: Qwen-style checkpoints pad their
    vocabularies to different sizes, so extra rows are cut and missing ones can never be drafted."""
    if logits.shape[-1] >= v:
        return logits[..., :v]
    return torch.cat([logits, logits.new_full((*logits.shape[:-1], v - logits.shape[-1]), float("-inf"))], dim=-1)


def draw(logits: torch.Tensor, ctx: RequestContext) -> tuple[int, torch.Tensor]:
    """One sampled draft from its logits: a draw from the warped distribution (returned too, for
    rejection sampling) with the request's generator."""
    q = warp(logits, ctx.params)
    return sample(q, uniform(ctx.generator)), q


def draw_rows(logits: torch.Tensor, ctx: RequestContext) -> Proposal:
    """One draft from each row of logits [k, V] (a parallel drafter's block): the rows' argmaxes, read
    in one go, when greedy; else each drawn as draw() does, the distributions kept."""
    if ctx.params.greedy:
        return Proposal(row_argmaxes(logits))
    drafts = [draw(row, ctx) for row in logits]
    return Proposal([token for token, _ in drafts], torch.stack([q for _, q in drafts]))


class DraftModelProposer(Proposer):
    name = "vanilla"
    mask_token: int | None = None  # a parallel draft's (PARD): its k drafts come from one forward

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
        self.tokens = list(prompt_ids)  # read in catch_up, where the loop first drafts

    def catch_up(self) -> None:
        if self.cache.length < len(self.tokens) - 1:  # the last token's logits are the first proposal's
            with torch.inference_mode():
                self.model(torch.tensor(self.tokens[self.cache.length : -1], device=self.ctx.device), self.cache,
                           num_logits=1)

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
            if self.ctx.params.greedy:
                self.drafts = self._greedy(logits, k)
                return Proposal(self.drafts)
            for i in range(k):
                token, q = draw(logits, self.ctx)
                self.drafts.append(token)
                probs.append(q)
                if i < k - 1:
                    logits = self._next_logits([token])
        return Proposal(self.drafts, torch.stack(probs))

    def _greedy(self, logits: torch.Tensor, k: int) -> list[int]:
        """k argmax drafts after the first draft's logits: on the CPU the rest in one C call where the
        model has one; else step by step, each argmax fed back as a device tensor and all k read at
        the end (no host sync between the steps: a GPU replays them back to back)."""
        token = logits.argmax(-1, keepdim=True)  # the first of equal maxima, as sampling.argmax
        if k > 1 and token.device.type == "cpu":
            rest = self.model.greedy_chain(int(token), self.cache, k - 1, self.target_vocab)
            if rest:
                return [int(token)] + rest
        drafts = [token]
        for _ in range(k - 1):
            token = over_vocab(self.model(token, self.cache, num_logits=1)[-1], self.target_vocab).argmax(-1, keepdim=True)
            drafts.append(token)
        return torch.cat(drafts).tolist()

    def kernel_run(self, target, cache, token, k, room, enough, eos, seconds, warp,
                   generator) -> list[Iteration] | None:
        """On the CPU, both models whole in the kernels: the iterations in one C call, the draft's
        forward (or forwards), its argmaxes (sampled: its draws, the acceptances and the next token's
        draw as the loop's rejection sampling does, uniforms for up to 64 iterations drawn ahead and the
        generator then left past the ones used), the target's pass and the acceptance each time (on the
        embedded pair the Python around each model call cost more than the draft forward itself)."""
        if self.cache.length >= len(self.tokens):
            self.cache.rollback(len(self.tokens) - 1)
        ours, theirs = self.model.kernel_decoder(self.cache), target.kernel_decoder(cache)
        if ours is None or theirs is None or ours.dtype != theirs.dtype:
            return None
        ahead = None if warp is None else Ahead.iterations(generator, min(room, enough), k)
        run, (cache.length, self.cache.length), used = cpu_layer_ops.draft_iterations(
            theirs, ours, cache.length, self.cache.length, self.tokens[self.cache.length :], self.mask_token, token, k,
            self.target_vocab, room, enough, eos, seconds, warp, None if ahead is None else ahead.values)
        if ahead is not None:
            ahead.settle(used)
        run = [Iteration(*iteration) for iteration in run]
        for iteration in run:
            self.tokens.extend(iteration.tokens)
        return run

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
    "vanilla", lambda ctx: DraftModelProposer(token_map.draft_model(ctx), ctx.max_len, ctx.target_vocab),
    "a smaller model of the same tokenizer drafts k tokens (--draft)",
    options=(token_map.TOKEN_MAP,), needs_draft=True, aliases=("draft_model", "draft"),
))
