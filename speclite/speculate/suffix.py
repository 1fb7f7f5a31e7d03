"""`suffix`: suffix decoding, model-free drafts from this request and from every earlier answer.

Two suffix trees (SuffixDecoding, Oliaro et al. 2024; vLLM's `{"method": "suffix"}`): one over
the current request (prompt + output so far), dropped when the request ends, and one over earlier
responses of this process (`ResponseCache`), which reset() keeps. Each iteration the suffixes of
the context (up to max_tree_depth tokens) are matched in both; from each match the most frequent
continuation is followed while its estimated probability stays at or above min_token_prob, for
at most max_spec_factor x match length + max_spec_offset tokens; the draft whose probabilities
sum highest wins. It pays where outputs repeat: agent loops, code edits, batch jobs over similar
records, chats quoting earlier answers.
"""

from __future__ import annotations

import logging
import os
from array import array
from pathlib import Path

from speclite.errors import SpecliteError
from speclite.speculate.base import Proposal, Proposer, RequestContext
from speclite.speculate.registry import Method, Option, register
from speclite.speculate.suffix_cache import ResponseCache, read_responses
from speclite.speculate.suffix_tree import SuffixTree, advance, continuation, has_continuation, matches

# The most drafts per iteration without --gen-num-per-cycle (vLLM's default for suffix too): a draft
# is only as long as its match and its likely tokens allow, so the cap costs nothing on short matches
# and lets long repeats go through in few verifications.
MAX_DRAFTS = 32
log = logging.getLogger(__name__)


class SuffixProposer(Proposer):
    name = "suffix"

    def __init__(
        self,
        vocab_size: int,
        max_tree_depth: int = 64,
        max_cached_requests: int = -1,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        cache_file: Path | None = None,
    ):
        self.vocab_size, self.depth = vocab_size, max_tree_depth
        self.factor, self.offset, self.min_prob = max_spec_factor, max_spec_offset, min_token_prob
        self.cache_file, self.save_failed = cache_file, False
        self.responses = ResponseCache(max_tree_depth, max_cached_requests)
        # What the cache file held at the start: forget() goes back to it (the file is the user's).
        self.from_file = [array("i", r) for r in read_responses(cache_file, vocab_size)] if (
            cache_file is not None and cache_file.exists()) else []
        for response in self.from_file:
            self.responses.add(response)
        self.request: SuffixTree | None = None

    def begin(self, prompt_ids: list[int], ctx: RequestContext) -> None:
        self.finish()
        self.request = SuffixTree(self.depth)
        self.growing = self.request.start(prompt_ids)
        self.response = array("i")
        # Earlier responses are matched against the context's last max_tree_depth tokens.
        self.found = matches(self.responses.tree, prompt_ids[-self.depth :])

    def observe(self, tokens: list[int], states=None) -> None:
        for t in tokens:
            self.request.append(self.growing, t)
            self.response.append(t)
            self.found = advance(self.responses.tree, self.found, t)

    def propose(self, k: int) -> Proposal:
        return self.propose_after([], k)

    def propose_after(self, drafts: list[int], k: int) -> Proposal:
        """Up to k drafts continuing the sequence plus `drafts` (another proposer's, unverified):
        the matches walk on through the drafts without adding them to either tree."""
        mine = [(node, node.length) for node in reversed(self.growing.active)]  # shortest suffix first
        found = self.found
        for t in drafts:
            mine = advance(self.request, mine, t)
            found = advance(self.responses.tree, found, t)
        tokens, score = self._best(mine[::-1], k)
        earlier, earlier_score = self._best(found[::-1], k)
        return Proposal(earlier if earlier_score > score else tokens)

    def _best(self, positions, k: int) -> tuple[list[int], float]:
        """The best-scoring draft over the matched suffixes, given longest first (ties: longest)."""
        best, best_score = [], 0.0
        for length in range(len(positions), 0, -1):
            limit = min(k, int(length * self.factor + self.offset + 1e-6))
            if best_score >= limit:
                break  # a draft of at most `limit` tokens scores at most `limit`: no shorter match wins
            node, idx = positions[len(positions) - length]
            if has_continuation(node, idx):
                tokens, score = continuation(node, idx, limit, self.min_prob)
                if score > best_score:
                    best, best_score = tokens, score
        return best, best_score

    def finish(self) -> None:
        """The request ended: its response joins the earlier ones (and the cache file)."""
        if self.request is None:
            return
        self.responses.add(self.response)
        self.request = None
        self._save()

    def _save(self) -> None:
        """The responses into the cache file; a failed write (a full disk) is said once and decoding goes
        on (the answer stands; the file keeps what it last held)."""
        if self.cache_file is None or self.responses.max_requests == 0:  # the global tree off: the file as it is
            return
        try:
            self.responses.save(self.cache_file, self.vocab_size)
        except SpecliteError as e:
            if not self.save_failed:
                log.warning(f"warning: {e}; answers go on, the file keeps what it held")
            self.save_failed = True

    def reset(self) -> None:
        """Cold per-request state; what was learned from earlier responses stays."""
        self.finish()

    def forget(self) -> None:
        """Forget the responses this process learned (an explicit request, never part of reset): back to
        what the cache file held at the start, which stays as it is until the next request's save."""
        self.request = None
        self.responses.forget()
        for response in self.from_file:
            self.responses.add(response)


def _check(options: dict) -> None:
    if options["suffix_max_tree_depth"] < 1:
        raise SpecliteError(f"--suffix-max-tree-depth must be at least 1, got {options['suffix_max_tree_depth']}")
    if options["suffix_max_cached_requests"] < -1:
        raise SpecliteError("--suffix-max-cached-requests must be -1 (unbounded), 0 (off) or a count, "
                            f"got {options['suffix_max_cached_requests']}")
    if options["suffix_max_spec_factor"] < 0:
        raise SpecliteError(f"--suffix-max-spec-factor must be >= 0, got {options['suffix_max_spec_factor']}")
    if not 0 <= options["suffix_min_token_prob"] <= 1:
        raise SpecliteError(f"--suffix-min-token-prob must be in [0, 1], got {options['suffix_min_token_prob']}")
    path = options["suffix_cache"]
    if path:
        folder = Path(path).parent
        if Path(path).is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
            raise SpecliteError(f"--suffix-cache {path}: not a writable file path")


def _build(ctx) -> SuffixProposer:
    o = ctx.options
    return SuffixProposer(ctx.target_vocab, o["suffix_max_tree_depth"], o["suffix_max_cached_requests"],
                          o["suffix_max_spec_factor"], o["suffix_max_spec_offset"], o["suffix_min_token_prob"],
                          Path(o["suffix_cache"]) if o["suffix_cache"] else None)


register(Method(
    "suffix", _build,
    "suffix decoding: drafts from suffix trees over this request and over earlier responses (no model)",
    options=(
        Option("suffix_max_tree_depth", int, 64, "Longest context suffix matched (and tree depth).",
               "--suffix-max-tree-depth", "suffix_decoding_max_tree_depth"),
        Option("suffix_max_cached_requests", int, -1, "Earlier responses kept for drafting, oldest evicted "
               "first; -1 unbounded, 0 off.", "--suffix-max-cached-requests", "suffix_decoding_max_cached_requests"),
        Option("suffix_max_spec_factor", float, 1.0, "Drafts at most this x the match length (+ offset).",
               "--suffix-max-spec-factor", "suffix_decoding_max_spec_factor"),
        Option("suffix_max_spec_offset", float, 0.0, "Added to the draft length cap.", "--suffix-max-spec-offset"),
        Option("suffix_min_token_prob", float, 0.1, "Stop a draft before a token whose estimated probability "
               "is below this.", "--suffix-min-token-prob", "suffix_decoding_min_token_prob"),
        Option("suffix_cache", str, "", "Load earlier responses from FILE if it exists; save them there after "
               "each request.", "--suffix-cache"),
    ),
    check=_check, default_k=lambda proposer: MAX_DRAFTS,
))
