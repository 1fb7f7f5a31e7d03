"""The decode loop: plain decoding and every speculative method, one function read top to bottom.

The prompt minus its last token is prefilled; then each iteration forwards the last committed
token plus the drafts (a chain, or a tree under a tree mask) through the target in one pass,
verifies, keeps the accepted path's cache entries and emits the accepted drafts plus one token
from the target; the proposer observes them with the hidden states it asked for. With no proposer
(k = 0) that is exactly plain decoding, so plain, naive and speculative runs share every line
that decides which token comes out; plain greedy decoding on the CPU kernels only batches its
steps, a chunk per call (the same tokens as single steps, tested).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from speclite.engine.stats import RequestStats
from speclite.model import KVCache, Transformer
from speclite.model.step import NOTHING, Tree
from speclite.sampling import SamplingParams, make_generator
from speclite.speculate.base import Proposal, Proposer, RequestContext
from speclite.speculate.schedule import SpecLength
from speclite.speculate.verify import get_verifier, reject_all

NO_DRAFTS = Proposal([])
CHUNK_S = 0.02  # plain greedy decoding's chunk: seconds of steps per call (a decode step or more)


@dataclass
class Speculation:
    proposer: Proposer
    length: SpecLength  # how many drafts to ask for, fixed or adaptive
    verify: str | None = None  # a --verify name; None: greedy at temperature 0, rejection otherwise
    accept_policy: str = "normal"  # "accept_all" / "reject_all": verifiers for debugging and overhead


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: set[int] = field(default_factory=set)
    extra: dict = field(default_factory=dict)  # extra_config: sp_advice_prompt ids, sp_edit


def decode(target: Transformer, cache: KVCache, request: Request, spec: Speculation | None = None) -> "Decoding":
    """Start decoding one request: iterate the result for each iteration's new tokens.

    `cache` may already hold a prefix of the prompt (a chat's earlier turns): only the rest is
    prefilled.
    """
    return Decoding(target, cache, request, spec)


class Decoding:
    """What happened to one request: its `stats` and `finish_reason` ("length" until EOS, or a
    stop string the caller found, makes it "stop"), up to date after each iteration."""

    def __init__(self, target: Transformer, cache: KVCache, request: Request, spec: Speculation | None):
        self.stats = RequestStats()
        self.finish_reason = "length"
        self._iterations = self._run(target, cache, request, spec)

    def __iter__(self) -> Iterator[list[int]]:
        return self._iterations

    def _run(self, target, cache, request, spec) -> Iterator[list[int]]:
        params, stats = request.params, self.stats
        device = cache.layers[0][0].device
        generator = make_generator(params.seed, device)
        # Plain decoding is the k=0 case: with no drafts, reject_all is the target's own argmax / draw.
        verifier = get_verifier(spec.verify, params, spec.accept_policy) if spec else reject_all
        wants = spec.proposer.wants if spec else NOTHING
        prompt = request.prompt_ids
        if cache.length >= len(prompt):
            cache.rollback(len(prompt) - 1)
        if wants:  # the states a proposer kept from earlier requests may end before the cache does
            cache.rollback(min(cache.length, spec.proposer.states_from(prompt)))
        prompt_from, prompt_states = cache.length, None
        if cache.length < len(prompt) - 1:
            step = target.step(torch.tensor(prompt[cache.length : -1], device=device), cache, 1, wants=wants)
            prompt_states = step if wants else None
        if spec is not None:
            ctx = RequestContext(params=params, generator=generator, extra=request.extra, device=device,
                                 prompt_states=prompt_states, prompt_from=prompt_from)
            spec.proposer.begin(prompt, ctx)

        try:
            token, produced, step_s = prompt[-1], 0, None
            chunked = spec is None and params.greedy and not params.stop  # may plain steps go in chunks
            while True:
                room = min(params.max_new_tokens - produced, cache.max_len - cache.length)
                if room <= 0:
                    return
                proposal = NO_DRAFTS
                started = time.perf_counter()
                if spec is not None:
                    k = min(spec.length.next_k(), room - 1)
                    if k > 0:
                        proposal = spec.proposer.propose(k)
                draft_s = time.perf_counter() - started
                verify_started = time.perf_counter()
                start = cache.length
                # Plain greedy decoding, once a step is timed: the target continues itself for a
                # chunk of steps in one call where its CPU kernels can (the tokens of single steps,
                # without Python between them), the chunk streamed about every CHUNK_S. Not with a
                # stop string: the engine looks for it after every token. Declined once (no kernels
                # for this model or device), declined for the request.
                chunk, n = None, min(room, int(CHUNK_S / step_s)) if chunked and step_s else 0
                if n > 1:
                    chunk = target.greedy_chain(token, cache, n, target.args.vocab_size)
                    chunked = chunk is not None
                if chunk:
                    path, new = [], chunk
                else:
                    # One pass over the last committed token and every draft; a tree sees ancestors only.
                    tree = None if proposal.is_chain else Tree.of(proposal.parents, device)
                    step = target.step(torch.tensor([token] + proposal.tokens, device=device), cache, tree=tree,
                                       wants=wants)
                    path, token = verifier(proposal, step.logits, params, generator)
                    rows = [0] + [1 + i for i in path]  # the forward's rows that stand
                    cache.keep([start + r for r in rows])
                    new = [proposal.tokens[i] for i in path] + [token]
                token = new[-1]
                verify_s = time.perf_counter() - verify_started
                step_s = verify_s / len(new)
                stats.draft_s += draft_s
                stats.verify_s += verify_s

                if spec is not None:
                    spec.length.observe(len(proposal.tokens), len(path), draft_s, verify_s)
                    spec.proposer.observe(new, step.select(rows) if wants else None)
                # A draft may carry an EOS that the target confirmed: stop right after it.
                for i, t in enumerate(new):
                    if t in request.eos_ids and not params.ignore_eos:
                        new = new[: i + 1]
                        self.finish_reason = "stop"
                        break
                produced += len(new)
                if chunk:
                    cache.rollback(start + len(new))  # what was fed after an EOS goes
                    for _ in new:  # a chunk is that many plain steps
                        stats.record(0, 0, 1)
                else:
                    stats.record(len(proposal.tokens), len(path), len(new), proposal.depth(), proposal.parts)
                yield new
                if self.finish_reason == "stop":
                    return
        finally:
            if spec is not None:
                spec.proposer.finish()
