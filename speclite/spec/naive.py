"""`naive`: the speculative code path with zero drafts, the baseline that must equal plain decoding."""

from speclite.spec.base import Proposal, Proposer, RequestContext


class NaiveProposer(Proposer):
    name = "naive"

    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        pass

    def propose(self, k: int) -> Proposal:
        return Proposal([])

    def observe(self, tokens: list[int]) -> None:
        pass
