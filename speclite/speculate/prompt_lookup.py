"""`deterministic`: prompt lookup (n-gram copy from prompt + output + advice) and speculative edit.

Prompt lookup matches the last n tokens (n from max_match down to min_match) against everything
seen so far and the request's `sp_advice_prompt`, and proposes what followed the most recent
match. Speculative edit (`sp_edit=1`) treats the advice as the draft itself: a pointer walks the
advice while the output follows it, and after a divergence re-aligns on the next n-gram match, so
long unchanged stretches are accepted in one pass each.
"""

from __future__ import annotations

from speclite.errors import SpecliteError
from speclite.speculate.base import Proposal, Proposer, RequestContext
from speclite.speculate.registry import Method, Option, register


class NgramIndex:
    """n-gram -> end position of its latest occurrence, kept up to date as tokens arrive."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.latest: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending at positions <= indexed are in `latest`

    def extend(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)

    def lookup(self, k: int, tail: list[int] = ()) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix
        of the tokens plus `tail` (drafts not yet verified: matched, never indexed)."""
        toks = self.tokens
        # Index every n-gram that has at least one token after it (ends before the last position).
        for end in range(self.indexed + 1, len(toks)):
            for n in range(self.min_n, self.max_n + 1):
                if end >= n:
                    self.latest[tuple(toks[end - n : end])] = end
        self.indexed = max(self.indexed, len(toks) - 1)
        recent = (toks[-self.max_n :] + list(tail))[-self.max_n :]
        for n in range(min(self.max_n, len(recent)), self.min_n - 1, -1):
            end = self.latest.get(tuple(recent[-n:]))
            if end is not None:
                return toks[end : end + k]
        return []


class PromptLookupProposer(Proposer):
    name = "deterministic"

    def __init__(self, min_match: int = 1, max_match: int = 3):
        self.min_match, self.max_match = min_match, max_match

    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        self.advice: list[int] = list(ctx.extra.get("sp_advice_ids", []))
        self.edit = bool(ctx.extra.get("sp_edit")) and bool(self.advice)
        self.context = NgramIndex(self.min_match, self.max_match)
        self.context.extend(prompt_ids)
        self.in_advice = NgramIndex(self.min_match, self.max_match)
        self.in_advice.extend(self.advice)
        self.cursor: int | None = 0 if self.edit else None  # next advice token expected (edit mode)
        self.last_cursor = 0

    def propose(self, k: int) -> Proposal:
        if self.edit and self.cursor is None:
            self.cursor = self._realign(self.context.tokens[-self.max_match :])
        return self.propose_after([], k)

    def propose_after(self, drafts: list[int], k: int) -> Proposal:
        """Up to k drafts continuing the sequence plus `drafts` (another proposer's, unverified)."""
        recent = (self.context.tokens[-self.max_match :] + drafts)[-self.max_match :]
        if self.edit:
            cursor, _ = self._follow(self.cursor, drafts)
            if cursor is None:
                cursor = self._realign(recent)
            if cursor is not None and cursor < len(self.advice):
                return Proposal(self.advice[cursor : cursor + k])
        return Proposal(self.context.lookup(k, drafts) or self._advice_lookup(k, recent))

    def _advice_lookup(self, k: int, tail: list[int]) -> list[int]:
        for n in range(min(self.max_match, len(tail)), self.min_match - 1, -1):
            j = _find(self.advice, tail[-n:], 0)
            if j is not None:
                return self.advice[j + n : j + n + k]
        return []

    def _realign(self, tail: list[int]) -> int | None:
        """After a divergence, the advice position following the output's latest n-gram (`tail`)."""
        for n in range(min(self.max_match, len(tail)), self.min_match - 1, -1):
            # Prefer the next occurrence at or after where we left the advice: edits move forward.
            j = _find(self.advice, tail[-n:], self.last_cursor)
            if j is None:
                j = _find(self.advice, tail[-n:], 0)
            if j is not None:
                return j + n
        return None

    def observe(self, tokens: list[int], states=None) -> None:
        self.context.extend(tokens)
        if not self.edit:
            return
        cursor, followed = self._follow(self.cursor, tokens)
        if followed:
            self.last_cursor = self.cursor + followed
        self.cursor = cursor

    def _follow(self, cursor: int | None, tokens: list[int]) -> tuple[int | None, int]:
        """(the advice cursor after `tokens`, None once they leave the advice; how many it followed)."""
        if cursor is None:
            return None, 0
        for i, t in enumerate(tokens):
            if cursor + i >= len(self.advice) or self.advice[cursor + i] != t:
                return None, i
        return cursor + len(tokens), len(tokens)


def _find(seq: list[int], pattern: list[int], start: int) -> int | None:
    n = len(pattern)
    for j in range(start, len(seq) - n + 1):
        if seq[j : j + n] == pattern:
            return j
    return None


def _check_bounds(options: dict) -> None:
    if not 1 <= options["min_match"] <= options["max_match"]:
        raise SpecliteError(f"need 1 <= --sp-min-token-match ({options['min_match']}) "
                            f"<= --sp-max-token-match ({options['max_match']})")


register(Method(
    "deterministic", lambda ctx: PromptLookupProposer(ctx.options["min_match"], ctx.options["max_match"]),
    "prompt lookup over prompt + output + sp_advice_prompt; sp_edit=1: speculative edit",
    options=(
        Option("min_match", int, 1, "Shortest n-gram prompt lookup matches.", "--sp-min-token-match",
               "prompt_lookup_min"),
        Option("max_match", int, 3, "Longest n-gram prompt lookup matches.", "--sp-max-token-match",
               "prompt_lookup_max"),
    ),
    check=_check_bounds, aliases=("ngram", "prompt_lookup"),
))
