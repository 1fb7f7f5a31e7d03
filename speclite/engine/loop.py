"""The decode loop: plain decoding and every speculative method, one function read top to bottom.

The prompt minus its last token is prefilled; then each iteration forwards the last committed
token plus the drafts (a chain, or a tree under a tree mask) through the target in one pass,
verifies, keeps the accepted path's cache entries and emits the accepted drafts plus one token
from the target; the proposer observes them with the hidden states it asked for. With no proposer
(k = 0) that is exactly plain decoding, so plain, naive and speculative runs share every line
that decides which token comes out; greedy decoding on the CPU kernels only batches its
iterations, plain steps or a proposer's speculative ones, many per call (the same tokens as
iterations one by one, tested).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from speclite.engine.stats import RequestStats
from speclite.kernels.cpu_threads import one_thread
from speclite.model import KVCache, Transformer
from speclite.model.step import NOTHING, Tree
from speclite.sampling import SamplingParams, make_generator
from speclite.speculate.base import Iteration, Proposal, Proposer, RequestContext
from speclite.speculate.schedule import SpecLength
from speclite.speculate.verify import get_verifier, greedy, reject_all, rejection

NO_DRAFTS = Proposal([])
CHUNK_S = 0.02  # plain greedy decoding's chunk: seconds of steps per call (a decode step or more)
# With a stop string the engine looks for it after each call, and what a call produced past it is work
# thrown away: a call then stops once it has produced as many tokens as came before it (so an early stop
# wastes little), two at least and this many at most (a speculative iteration that passes it is finished:
# each iteration drafts as it would in a call without the stop, so seeded sampling draws the same text).
STOP_CHUNK_TOKENS = 16


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
    stop string the caller found, makes it "stop"), up to date after each iteration; `last` once the
    tokens yielded are all there will be (EOS, max_new_tokens or the context reached)."""

    def __init__(self, target: Transformer, cache: KVCache, request: Request, spec: Speculation | None):
        self.stats = RequestStats()
        self.finish_reason = "length"
        self.last = False
        self._iterations = self._run(target, cache, request, spec)

    def __iter__(self) -> Iterator[list[int]]:
        return self._iterations

    def close(self) -> None:
        """End the request now (a caller that stopped iterating early): the proposer's finish runs here,
        not whenever the collector gets to the iterations, perhaps in the middle of the next request."""
        self._iterations.close()

    def cut(self, kept: int) -> None:
        """The caller keeps only the first `kept` tokens of the last chunk (a stop string ends the output
        there): the iterations a kernel call ran after them leave the stats, as plain decoding stops."""
        run, emitted = self._last
        self._record(run, emitted, times=-1)
        self._record(run, kept)

    def _record(self, run: list[Iteration], emitted: int, times: int = 1) -> None:
        """The stats of a call's iterations whose tokens made the first `emitted` of its chunk; an
        iteration cut short (by an EOS among its drafts, or a stop string) counts the drafts that stood
        up to its last token out (those after it never became output)."""
        for iteration in run:
            out = min(len(iteration.tokens), emitted)
            self.stats.record(iteration.drafted, min(iteration.accepted, out), out, iteration.depth, iteration.parts,
                              times)
            emitted -= len(iteration.tokens)
            if emitted <= 0:
                break

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
            # May iterations run in calls of their own: plain decoding, argmax verification or rejection
            # sampling (not a debugging policy's, nor another verifier's).
            chunked = spec is None or verifier is (greedy if params.greedy else rejection)
            declined = set()  # the kinds of call ("plain", "speculative") declined for this request
            # The tokens that end the answer: EOS (unless ignored) and the request's own stop tokens.
            eos = (set() if params.ignore_eos else request.eos_ids) | set(params.stop_token_ids)

            def room_left() -> int:  # the new tokens this request may still make
                return min(params.max_new_tokens - produced, cache.max_len - cache.length)

            while True:
                room = room_left()
                if room <= 0:
                    return
                k = min(spec.length.next_k(), room - 1) if spec is not None else 0
                if k > 0:
                    spec.proposer.catch_up()
                started, start = time.perf_counter(), cache.length
                # Once an iteration is timed: about CHUNK_S of iterations in one call where the CPU
                # kernels can, without Python between them (the tokens of iterations one by one): plain
                # steps as the target's chain (greedy, or sampled with the generator's next uniforms),
                # speculative iterations where the proposer runs them with the target (greedy_run,
                # sampled_run); streamed after each call (with a stop string, shorter calls: the engine
                # ends the output at the token that completes it). Declined once (no kernels for these
                # models or device, a tree), that kind of call is declined for the request; the other
                # kind may still run.
                # With a proposer, plain steps (k = 0, auto's choice where speculation cannot pay) run as
                # the target's chain too, keeping the states the proposer wants; each iteration is
                # charged its share of the call, for auto's table of costs. That table leaves out a
                # request's first iteration (one by one, to time the chunk) and, where calls could run
                # them, the iterations run one by one (the last steps too few for a chain).
                run, timed, kind = None, step_s is not None, "speculative" if k else "plain"
                if chunked and step_s and kind not in declined:
                    enough = min(room, STOP_CHUNK_TOKENS, max(2, produced)) if params.stop else room
                    if k == 0:
                        steps, vocab = min(enough, int(CHUNK_S / step_s)), target.args.vocab_size
                        chained = (target.chain(token, cache, steps, vocab, params, generator, wants) if steps > 1
                                   else ([], None))
                        if chained is not None:
                            chain, states = chained
                            each = (time.perf_counter() - started) / max(len(chain), 1)
                            run = [Iteration(0, 0, [t], 0.0, each) for t in chain]
                            if run and spec is not None:
                                new = until_eos(chain, eos)  # the states of the rows that fed them
                                spec.proposer.observe(new, states.select(list(range(len(new)))) if wants else None)
                    elif params.greedy:
                        run = spec.proposer.greedy_run(target, cache, token, k, room, enough, eos, CHUNK_S)
                    else:
                        run = spec.proposer.sampled_run(target, cache, token, k, room, enough, eos, CHUNK_S, params,
                                                        generator)
                    if run is None:
                        declined.add(kind)
                    timed = run != []
                if run:
                    new = [t for iteration in run for t in iteration.tokens]
                    draft_s = sum(iteration.draft_s for iteration in run)
                    verify_s = time.perf_counter() - started - draft_s
                else:
                    proposal = spec.proposer.propose(k) if k > 0 else NO_DRAFTS
                    draft_s = time.perf_counter() - started
                    # One pass over the last committed token and every draft; a tree sees ancestors only.
                    tree = None if proposal.is_chain else Tree.of(proposal.parents, device)
                    step = target.step(torch.tensor([token] + proposal.tokens, device=device), cache, tree=tree,
                                       wants=wants)
                    with one_thread(device):  # a sampled verdict's torch ops, before the next forward
                        path, token = verifier(proposal, step.logits, params, generator)
                    rows = [0] + [1 + i for i in path]  # the forward's rows that stand
                    cache.keep([start + r for r in rows])
                    new = [proposal.tokens[i] for i in path] + [token]
                    verify_s = time.perf_counter() - started - draft_s
                    run = [Iteration(len(proposal.tokens), len(path), new, draft_s, verify_s, proposal.depth(), proposal.parts)]
                    if spec is not None:
                        spec.proposer.observe(new, step.select(rows) if wants else None)
                token = new[-1]
                step_s = verify_s / len(new)
                stats.draft_s += draft_s
                stats.verify_s += verify_s
                if spec is not None:
                    # The call's time outside its iterations' own clocks (its start, the handing back of
                    # tokens and timings) shared by them: the costs the schedule compares are wall time.
                    extra = (verify_s + draft_s - sum(it.draft_s + it.verify_s for it in run)) / len(run)
                    for iteration in run:
                        spec.length.observe(iteration.drafted, iteration.accepted,
                                            *((iteration.draft_s, iteration.verify_s + extra) if timed else ()))
                # A draft may carry an EOS that the target confirmed: stop right after it.
                new = until_eos(new, eos)
                if new[-1] in eos:
                    self.finish_reason = "stop"
                produced += len(new)
                cache.rollback(start + len(new))  # what was fed after an EOS goes
                self._last = run, len(new)
                self._record(run, len(new))
                self.last = self.finish_reason == "stop" or room_left() <= 0
                yield new
                if self.finish_reason == "stop":
                    return
        finally:
            if spec is not None:
                spec.proposer.finish()


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """The tokens up to and including the first one in `eos` (all of them where none is)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens
