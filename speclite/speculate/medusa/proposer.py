"""`medusa`: the heads draft from the final state of the row that produced the newest token.

That row (the prefill's last, then each iteration's last standing row) is position n - 2 of an
n-token sequence; the target's logits there gave token n - 1, so head i guesses token n + i. No
cache: drafting is one small MLP per head on one state. A chain under sampling draws draft i from
head i's warped distribution and returns it for rejection sampling (the heads do not read earlier
drafts, so that distribution is exactly what draft i was drawn from). Otherwise the drafts are the
tree's paths of top-k ranks (a chain is the tree of rank-0 paths): deterministic, distinct
siblings, verified as one-hot drafts.
"""

from __future__ import annotations

import torch

from speclite.model.step import Step, Wants
from speclite.sampling import sample, uniform, warp
from speclite.speculate.base import Proposal, Proposer, RequestContext
from speclite.speculate.medusa.head import MedusaHeads
from speclite.speculate.medusa.tree import Ranks, default_tree


class MedusaProposer(Proposer):
    name = "medusa"
    wants = Wants(final=True)

    def __init__(self, heads: MedusaHeads, topk: int = 1, tree: list[Ranks] | None = None):
        self.heads, self.topk, self.tree = heads, topk, tree
        self.sample_chain = tree is None and topk == 1
        self.default_trees: dict[int, list[Ranks]] = {}  # budget k -> the default tree of k nodes
        self.state: torch.Tensor | None = None  # final state of the row that produced the newest token

    @property
    def most_drafts(self) -> int:
        """The most drafts an iteration can make: the given tree's paths, else every path of ranks below
        topk one head deep or more (a chain: one draft per head)."""
        if self.tree is not None:
            return len(self.tree)
        return sum(self.topk**depth for depth in range(1, len(self.heads) + 1))

    def resident(self) -> tuple[list, list]:
        return [self.heads], []

    def reset(self) -> None:
        self.state = None

    def states_from(self, prompt_ids: list[int]) -> int:
        """The state of the row before the prompt's last token: recomputed where the cache holds it,
        so a repeated prompt drafts in its first iteration as it did the first time."""
        return max(len(prompt_ids) - 2, 0)

    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        self.ctx = ctx
        # No prefill (a one-token prompt): the first iteration runs without drafts.
        self.state = ctx.prompt_states.final[-1] if ctx.prompt_states is not None else None

    def observe(self, tokens: list[int], states: Step | None = None) -> None:
        self.state = states.final[-1] if states is not None else None

    def propose(self, k: int) -> Proposal:
        if self.state is None or k < 1:
            return Proposal([])
        with torch.inference_mode():
            if self.sample_chain and not self.ctx.params.greedy:
                q = warp(self.heads(self.state, min(k, len(self.heads))), self.ctx.params)
                return Proposal([sample(row, uniform(self.ctx.generator)) for row in q], q)
            paths = self._paths(k)
            logits = self.heads(self.state, max(len(p) for p in paths))
            top = torch.topk(logits, 1 + max(r for p in paths for r in p), dim=-1).indices.tolist()
        index = {p: i for i, p in enumerate(paths)}
        return Proposal([top[len(p) - 1][p[-1]] for p in paths], None,
                        [index[p[:-1]] if len(p) > 1 else -1 for p in paths])

    def _paths(self, k: int) -> list[Ranks]:
        """The first k paths of the tree (ancestors come first, so they form a tree)."""
        if self.tree is not None:
            return self.tree[:k]
        if k not in self.default_trees:
            self.default_trees[k] = default_tree(self.topk, len(self.heads), k)
        return self.default_trees[k]
