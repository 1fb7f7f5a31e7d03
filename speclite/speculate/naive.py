"""`naive`: the speculative code path with zero drafts, the baseline that must equal plain decoding."""

from speclite.speculate.base import Proposal, Proposer, RequestContext
from speclite.speculate.registry import Method, register


class NaiveProposer(Proposer):
    name = "naive"

    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        pass

    def propose(self, k: int) -> Proposal:
        return Proposal([])

    def observe(self, tokens: list[int], states=None) -> None:
        pass


register(Method("naive", lambda ctx: NaiveProposer(), "the speculative loop with zero drafts (the baseline)",
                fixed_k=0))
