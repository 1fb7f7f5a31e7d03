"""`eagle3`: the head drafts a chain (topk 1) or a tree from the target's own hidden states.

The head's cache holds one entry per committed position p: the pair (the target's fused states at
p, the token at p + 1). Each target pass hands over the states of the positions that stood, so the
pairs up to the newest token are known; drafting first runs those pending pairs (they stay: they
are the target's), then feeds each draft with the head's own pre-norm output of the step before.
Draft entries are dropped on the next observe by moving the length pointer back.

Trees follow SGLang's three knobs: `steps` head passes, `topk` children per expanded node, and a
budget of draft tokens: every pass expands the topk best nodes (by cumulative log-probability)
of the pass before; the budget keeps the best nodes of all passes, which is ancestor-closed because
a child never scores above its parent. Tree drafts are the head's top-k (deterministic, distinct
siblings), so a verifier treats each as a one-hot draft; a chain under sampling draws its drafts
from the head's warped distribution and returns it for rejection sampling.
"""

from __future__ import annotations

import torch
from torch import nn

from speclite.kernels import cpu_gemm, cpu_layer_ops
from speclite.model.decoder import embed_rows, hooked, rope_rows
from speclite.model.kv_cache import shared_prefix
from speclite.model.step import Step, Wants
from speclite.sampling import Ahead, sample, uniform, warp
from speclite.speculate.base import Iteration, Proposal, Proposer, RequestContext
from speclite.speculate.eagle3.head import Eagle3Head


class Eagle3Proposer(Proposer):
    name = "eagle3"

    def __init__(self, head: Eagle3Head, embed: nn.Embedding, max_len: int, target_vocab: int, topk: int = 1,
                 steps: int | None = None, num_draft_tokens: int | None = None):
        self.head, self.embed = head, embed
        self.wants = self._wants()
        self.cache = head.new_cache(max_len)
        self.target_vocab = target_vocab
        self.topk, self.steps, self.num_draft_tokens = topk, steps, num_draft_tokens
        self.tokens: list[int] = []
        self.committed = 0  # head-cache entries that are the target's pairs (the rest are drafts)
        self.pending: torch.Tensor | None = None  # fused states of positions committed.. not yet in the cache
        self.waiting: list[Step] = []  # the states of the positions after pending's, not fused yet (catch_up)

    def _wants(self) -> Wants:
        return Wants(layers=tuple(sorted(set(self.head.aux_layers))))  # the inputs of these target layers

    def _states(self, step: Step) -> torch.Tensor:
        """The head's state input for each row of `step`: fc over the concatenated layer inputs."""
        return self.head.fuse(cpu_layer_ops.cat([step.layers[i] for i in self.head.aux_layers], dim=-1))

    def resident(self) -> tuple[list, list]:
        return [self.head], [self.cache]

    def reset(self) -> None:
        self.tokens, self.committed, self.pending, self.waiting = [], 0, None, []
        self.cache.rollback(0)

    def _standing(self, prompt_ids: list[int]) -> tuple[int, int]:
        """(entries, pending rows) that stand for a request of `prompt_ids`. Entry p pairs position
        p with token p + 1, so it stands while both are unchanged; a pending row (the states of one
        position, before it joins the cache) while its position's token and those before are. The
        prompt's last pair (position n - 2) stays pending, as in a request that prefilled it all:
        the head's first draft comes from running it, so a repeated prompt drafts as it did first."""
        common = min(shared_prefix(self.tokens, prompt_ids), len(prompt_ids) - 1)
        entries = min(self.committed, max(common - 1, 0))
        pending = 0 if entries < self.committed else self._rows()
        return entries, max(min(pending, common - entries), 0)

    def _rows(self) -> int:
        """The states known past the committed entries: fused (pending), then waiting."""
        return (0 if self.pending is None else self.pending.shape[0]) + sum(w.rows for w in self.waiting)

    def states_from(self, prompt_ids: list[int]) -> int:
        return sum(self._standing(prompt_ids))

    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        self.ctx = ctx
        self.committed, rows = self._standing(prompt_ids)
        self.cache.rollback(self.committed)
        if rows > (0 if self.pending is None else self.pending.shape[0]):
            self.catch_up()  # waiting states that stand
        self.tokens, self.pending, self.waiting = list(prompt_ids), self.pending[:rows] if rows else None, []
        if ctx.prompt_states is not None:  # the prefill's rows: prompt positions prompt_from..
            self._take(ctx.prompt_states, ctx.prompt_from)

    def observe(self, tokens: list[int], states: Step | None = None) -> None:
        self.cache.rollback(self.committed)
        if states is not None:  # rows of the previous last token, then of each accepted draft
            self._take(states, len(self.tokens) - 1)
        self.tokens.extend(tokens)

    def _take(self, states: Step, first: int) -> None:
        """The target's states of positions first..: following the rows known, they wait to be fused
        until drafting needs them (catch_up); from an earlier position, fused now, they replace the
        rows from there on."""
        if first == self.committed + self._rows():
            self.waiting.append(states)
            return
        self.catch_up()
        with torch.inference_mode():
            fused = self._states(states)
        if first > self.committed + (0 if self.pending is None else self.pending.shape[0]):
            raise ValueError(f"EAGLE-3 states from position {first} leave a gap after {self.committed}")
        if first < self.committed:  # rows the cache already holds: recompute them from these states
            self.committed = first
            self.cache.rollback(first)
            self.pending = fused
        else:
            kept = self.pending[: first - self.committed] if self.pending is not None else fused[:0]
            self.pending = cpu_layer_ops.cat([kept, fused], dim=0)

    def catch_up(self) -> None:
        """The waiting states fused (fc over each row's layer inputs) onto the pending rows: before a
        call that drafts, outside its clock, so that a request decoded plainly never pays for it."""
        if self.waiting:
            with torch.inference_mode():
                fused = [self._states(w) for w in self.waiting]
            self.waiting = []
            self.pending = cpu_layer_ops.cat(fused if self.pending is None else [self.pending, *fused], dim=0)

    def kernel_run(self, target, cache, token, k, room, enough, eos, seconds, warp,
                   generator) -> list[Iteration] | None:
        """On the CPU, target and head whole in the kernels and a chain asked for: the iterations in one
        C call, the head's chain (its pending pairs first; sampled: drawn from the head's warps over
        the target's vocabulary, an MTP module's being the target's, checked at load), the target's
        pass (capturing the layers an EAGLE-3 head reads), the acceptance or rejection sampling and the
        next states (fc over the stood rows' captures, or MTP's final normed states) each time. []
        where the pending rows are not all pairs yet, or the pairs start at a position whose embedding
        the head zeroes (the loop's own iteration then)."""
        self.catch_up()
        head = self.head
        theirs = None if self.topk != 1 else target.kernel_decoder(cache)  # (the embedding is the target's)
        layers = None if theirs is None or self.pending is None else head.cpu_layers(self.pending)
        states = None if layers is None else self._kernel_states()
        if states is None or theirs.dtype != self.pending.dtype or self.cache.layers[0][0].dtype != self.pending.dtype:
            return None
        c, t = self.committed, self.pending.shape[0]
        if t != len(self.tokens) - 1 - c or (c == 0 and head.zeroes_position_0):
            return []
        k = min(k, self.steps or k)
        cos, sin = rope_rows(head, slice(0, self.cache.max_len), self.cache.max_len, self.pending.dtype, self.pending.device)
        ahead = None if warp is None else Ahead.iterations(generator, min(room, enough), k)
        run, (cache.length, self.committed), self.pending, used = cpu_layer_ops.head_iterations(
            theirs, layers, head.target_ids, *states, head.normed_state, self.cache.layers[0], cos, sin, cache.length, c,
            self.tokens[c + 1 :], self.pending, token, k, room, enough, eos, seconds, warp,
            None if ahead is None else ahead.values)
        if ahead is not None:
            ahead.settle(used)
        self.cache.length = self.committed
        run = [Iteration(*iteration) for iteration in run]
        for iteration in run:
            self.tokens.extend(iteration.tokens)
        return run

    def _kernel_states(self) -> tuple | None:
        """How greedy_run's C loop makes the head's states as _states does: (fc's matrices, the target
        layers whose inputs it reads); None where the kernels cannot (a norm before fc, a hook)."""
        fc = self.head.model.fc
        if self.head.model.input_norm is not None or hooked([fc]):
            return None
        fuse = cpu_gemm.module_matrices(self.pending, [fc])
        return None if fuse is None else (fuse, list(self.head.aux_layers))

    def _step(self, tokens: list[int] | torch.Tensor, hidden: torch.Tensor, positions: list[int] | torch.Tensor,
              mask=None):
        """The head's (logits, states) for these rows; tokens and positions may already be device tensors."""
        device = hidden.device
        embeds = embed_rows(self.embed, torch.as_tensor(tokens, device=device), hidden.dtype)
        return self.head(embeds, hidden, torch.as_tensor(positions, device=device), self.cache, mask)

    def propose(self, k: int) -> Proposal:
        # Pending rows whose next token is known are the target's pairs: they join the committed cache.
        self.catch_up()
        c = self.committed
        n_pairs = 0 if self.pending is None else min(self.pending.shape[0], len(self.tokens) - 1 - c)
        room = self.cache.max_len - c - n_pairs
        if n_pairs < 1 or k < 1 or room < 1:
            return Proposal([])
        pairs, states = self.tokens[c + 1: c + 1 + n_pairs], self.pending[:n_pairs]
        self.committed, self.pending = c + n_pairs, self.pending[n_pairs:]
        with torch.inference_mode():
            if self.topk == 1:  # a chain of `steps` head passes (SGLang's knob), at most k
                k = min(k, room, self.steps or k)
                # Greedy: the pairs and the whole chain in one call where the head can (the same drafts).
                greedy = self.ctx.params.greedy
                drafts = self.head.greedy_chain(pairs, states, self.cache, k, self.embed) if greedy else None
                if drafts:
                    return Proposal(drafts)
            logits, state = self._step(pairs, states, list(range(c, c + n_pairs)))
            if self.topk == 1:
                return self._chain(logits[-1], state[-1:], k)
            return self._tree(logits[-1], state[-1:], min(k, (self.num_draft_tokens or k + 1) - 1), room)

    def _chain(self, logits, state, k: int) -> Proposal:
        """k drafts, step by step: drawn from the head's warped distributions, which come back for
        rejection sampling; when greedy, its argmaxes (the topk-1 tree's drafts, without its masks
        and log-probabilities), each fed back as a device tensor and all k read at the end (no host
        sync between a GPU's steps)."""
        params, gen = self.ctx.params, self.ctx.generator
        if params.greedy:
            drafts = [self.head.target_ids[logits.argmax(-1, keepdim=True)]]  # the first of equal maxima
            for position in range(self.committed, self.committed + k - 1):
                logits, state = self._step(drafts[-1], state, torch.arange(position, position + 1, device=state.device))
                drafts.append(self.head.target_ids[logits[-1].argmax(-1, keepdim=True)])
            return Proposal(torch.cat(drafts).tolist())
        drafts, probs = [], []
        for i in range(k):
            q = warp(self.head.to_target(logits, self.target_vocab), params)
            drafts.append(sample(q, uniform(gen)))
            probs.append(q)
            if i < k - 1:
                logits, state = self._step(drafts[-1:], state, [self.committed + i])
                logits = logits[-1]
        return Proposal(drafts, torch.stack(probs))

    def _tree(self, logits, state, budget: int, room: int) -> Proposal:
        topk = min(self.topk, logits.shape[-1])
        steps = min(self.steps or budget, max(1, 1 + (room - 1) // topk))
        # Nodes in creation order (parents first): token, parent, cumulative log-prob, depth.
        tokens, parents, scores, depths = [], [], [], []
        entry: dict[int, int] = {}  # node -> its head-cache entry, once fed

        def expand(parent: int, lp: torch.Tensor, base: float, depth: int) -> list[int]:
            top = torch.topk(lp, topk)
            made = []
            for value, idx in zip(top.values.tolist(), top.indices.tolist()):
                made.append(len(tokens))
                tokens.append(int(self.head.target_ids[idx]))
                parents.append(parent)
                scores.append(base + value)
                depths.append(depth)
            return made

        frontier = expand(-1, torch.log_softmax(logits.float(), -1), 0.0, 1)
        states = {-1: state[0]}
        for _ in range(steps - 1):
            fed_before = len(entry)
            for i, node in enumerate(frontier):
                entry[node] = self.committed + fed_before + i
            mask = self._tree_mask(frontier, parents, entry)
            hidden = torch.stack([states[parents[n]] for n in frontier])
            positions = [self.committed - 1 + depths[n] for n in frontier]
            out, new_states = self._step([tokens[n] for n in frontier], hidden, positions, mask)
            lps = torch.log_softmax(out.float(), -1)
            children = []
            for row, node in enumerate(frontier):
                states[node] = new_states[row]
                children += expand(node, lps[row], scores[node], depths[node] + 1)
            frontier = sorted(children, key=lambda n: (-scores[n], n))[:topk]
        keep = sorted(sorted(range(len(tokens)), key=lambda n: (-scores[n], depths[n], n))[:budget])
        index = {node: i for i, node in enumerate(keep)}
        return Proposal([tokens[n] for n in keep], None, [index[parents[n]] if parents[n] >= 0 else -1 for n in keep])

    def _tree_mask(self, rows: list[int], parents: list[int], entry: dict[int, int]) -> torch.Tensor:
        """[rows, cache.length + rows]: the committed entries and each row's fed ancestors and itself."""
        end = self.cache.length + len(rows)
        mask = torch.zeros(len(rows), end, dtype=torch.bool, device=self.cache.layers[0][0].device)
        mask[:, : self.committed] = True
        for r, node in enumerate(rows):
            while node >= 0:
                mask[r, entry[node]] = True
                node = parents[node]
        return mask
