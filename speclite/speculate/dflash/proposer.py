"""`dflash`: the drafter proposes a block of k drafts in one forward from the target's states.

The drafter's cache holds one context entry per committed position p < len(tokens) - 1 (the
target's states at p, fused); the states the target hands over on each observe (rows of the last
committed token and of each accepted draft) wait as pending rows until the next propose injects
them, so a rejected draft never reaches the cache and nothing needs cropping then. The block's
own entries are written past the context and dropped by leaving the length pointer there. Each
draft is drawn from its own row's distribution, independent of the drafts before it, which
rejection sampling allows (any proposal distribution keeps the target's).
"""

from __future__ import annotations

import torch
from torch import nn

from speclite.kernels import cpu_layer_ops
from speclite.model.decoder import over_tokens
from speclite.model.kv_cache import shared_prefix
from speclite.model.step import Step, Wants
from speclite.sampling import Ahead
from speclite.speculate.base import Iteration, Proposal, Proposer, RequestContext
from speclite.speculate.dflash.draft import DFlashDraft
from speclite.speculate.draft_model import draw_rows


class DFlashProposer(Proposer):
    name = "dflash"

    def __init__(self, draft: DFlashDraft, embed: nn.Embedding, lm_head: nn.Module, max_len: int,
                 vocab_map: torch.Tensor | None = None, own_head: bool = False):
        # lm_head: the target's, or the proposer's own (own_head): (--token-map) the target's rows of the
        # tokens vocab_map lists, and/or (--draft-quant BODY/HEAD) a quantized copy
        self.draft, self.embed, self.lm_head, self.vocab_map = draft, embed, lm_head, vocab_map
        self.own_head = own_head
        # The outputs of layer i are the inputs of layer i + 1 (the last one's: Wants' num_layers).
        self.wants = Wants(layers=tuple(sorted({i + 1 for i in draft.target_layers})))
        self.cache = draft.new_cache(max_len)
        self.tokens: list[int] = []
        norm = draft.model.norm.weight
        self.none = torch.empty(0, draft.args.hidden_size, dtype=norm.dtype, device=norm.device)
        self.pending = self.none  # context rows of positions cache.length.., not yet injected
        self.waiting: list[Step] = []  # the states of the positions after pending's, not fused yet (catch_up)

    def resident(self) -> tuple[list, list]:
        return [self.draft] + ([self.lm_head] if self.own_head else []), [self.cache]

    def reset(self) -> None:
        self.tokens, self.pending, self.waiting = [], self.none, []
        self.cache.rollback(0)

    def _standing(self, prompt_ids: list[int]) -> tuple[int, int]:
        """(entries, pending rows) that stand for a request of `prompt_ids`: the states at p depend
        on tokens 0..p, so those of p < common stand, and the context stops before the last token
        (the block's first row)."""
        stand = min(shared_prefix(self.tokens, prompt_ids), len(prompt_ids) - 1)
        entries = min(self.cache.length, stand)
        return entries, min(self._rows(), stand - entries)

    def _rows(self) -> int:
        """The states known past the cache's entries: fused (pending), then waiting."""
        return self.pending.shape[0] + sum(w.rows for w in self.waiting)

    def states_from(self, prompt_ids: list[int]) -> int:
        return sum(self._standing(prompt_ids))

    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        self.ctx = ctx
        entries, rows = self._standing(prompt_ids)
        if rows > self.pending.shape[0]:
            self.catch_up()  # waiting states that stand
        self.pending, self.waiting = self.pending[:rows], []
        self.cache.rollback(entries)
        self.tokens = list(prompt_ids)
        if ctx.prompt_states is not None:  # the prefill's rows: prompt positions prompt_from..
            self._take(ctx.prompt_states, ctx.prompt_from)

    def observe(self, tokens: list[int], states: Step | None = None) -> None:
        if states is not None:  # rows of the previous last token, then of each accepted draft
            self._take(states, len(self.tokens) - 1)
        self.tokens.extend(tokens)

    def _take(self, states: Step, first: int) -> None:
        """Context rows from the target's states of positions first..: following the rows known, they
        wait to be fused until drafting needs them (catch_up); from an earlier position, fused now,
        they replace the rows from there on."""
        if first == self.cache.length + self._rows():
            self.waiting.append(states)
            return
        self.catch_up()
        fused = self._context(states)
        known = self.cache.length + self.pending.shape[0]
        if first > known:
            raise ValueError(f"DFlash states from position {first} leave a gap after {known}")
        if first < self.cache.length:  # entries the cache already holds: recompute them from these states
            self.cache.rollback(first)
            self.pending = fused
        else:
            self.pending = cpu_layer_ops.cat([self.pending[: first - self.cache.length], fused], dim=0)

    def _context(self, states: Step) -> torch.Tensor:
        """Context rows (fc, hidden_norm) from the target's states."""
        with torch.inference_mode():
            return self.draft.fuse(cpu_layer_ops.cat([states.layers[i + 1] for i in self.draft.target_layers], dim=-1))

    def catch_up(self) -> None:
        """The waiting states fused onto the pending rows: before a call that drafts, outside its
        clock, so that a request decoded plainly never pays for it."""
        if self.waiting:
            fused = [self._context(w) for w in self.waiting]
            self.waiting = []
            self.pending = cpu_layer_ops.cat([self.pending, *fused], dim=0)

    def kernel_run(self, target, cache, token, k, room, enough, eos, seconds, warp,
                   generator) -> list[Iteration] | None:
        """On the CPU, target and drafter whole in the kernels: the iterations in one C call (the
        context's injection, the block's forward and argmaxes or draws, the target's pass capturing the
        layers the drafter reads, the acceptance or rejection sampling, fc and hidden_norm over the stood
        rows). [] where the pending rows do not reach the last token (the loop's own iteration then)."""
        self.catch_up()
        theirs = target.kernel_decoder(cache)
        ours = None if theirs is None else self.draft.kernel_decoder(self.pending, self.cache, self.embed, self.lm_head,
                                                                     self.vocab_map)
        if ours is None or theirs.dtype != self.pending.dtype:
            return None
        decoder, kv, fuse, norm = ours
        if self.pending.shape[0] != len(self.tokens) - 1 - self.cache.length:
            return []
        k = min(k, self.draft.block_size - 1)
        ahead = None if warp is None else Ahead.iterations(generator, min(room, enough), k)
        run, (cache.length, self.cache.length), self.pending, used = cpu_layer_ops.dflash_iterations(
            theirs, decoder, kv, fuse, norm.weight, norm.eps, [i + 1 for i in self.draft.target_layers],
            self.draft.mask_token, cache.length, self.cache.length, self.pending, token, k, room, enough, eos, seconds,
            warp, None if ahead is None else ahead.values)
        if ahead is not None:
            ahead.settle(used)
        run = [Iteration(*iteration) for iteration in run]
        for iteration in run:
            self.tokens.extend(iteration.tokens)
        return run

    def propose(self, k: int) -> Proposal:
        self.catch_up()
        start = len(self.tokens) - 1  # the last committed token's position: the block's first row
        need = start - self.cache.length  # context rows to inject first
        k = min(k, self.draft.block_size - 1, self.cache.max_len - start - 1)
        if k < 1 or self.pending.shape[0] < need:
            return Proposal([])  # states of the context are missing (none were asked for): no drafts
        ids = torch.tensor([self.tokens[-1]] + [self.draft.mask_token] * k, device=self.ctx.device)
        with torch.inference_mode():
            embeds = self.embed(ids).to(self.pending.dtype)
            hidden = self.draft(self.pending[:need], embeds, self.cache)
            self.pending = self.pending[need:]
            logits = self.lm_head(hidden[1:])  # the target's head: the target's vocabulary
            if self.vocab_map is not None:
                logits = over_tokens(logits, self.vocab_map, self.embed.num_embeddings)
            return draw_rows(logits, self.ctx)
