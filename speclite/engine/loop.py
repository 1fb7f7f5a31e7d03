"""The decode loop: plain decoding and every speculative method, one function read top to bottom.

The prompt minus its last token is prefilled; then each iteration forwards the last committed
token plus k drafts through the target in one pass, verifies, rolls the cache back to the
accepted length and emits the accepted drafts plus one token from the target. With no proposer
(k = 0) that is exactly plain decoding, so plain, naive and speculative runs share every line
that decides which token comes out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from speclite.engine.sampling import SamplingParams, make_generator, sample, warp
from speclite.engine.stats import RequestStats
from speclite.model import KVCache, Transformer
from speclite.spec.base import Proposer, RequestContext
from speclite.spec.schedule import SpecLength
from speclite.spec.verify import Verifier


@dataclass
class Finish:
    reason: str = "length"  # "stop" (EOS) or "length" (max_new_tokens / context full)


@dataclass
class Speculation:
    proposer: Proposer
    verifier: Verifier
    length: SpecLength  # how many drafts to ask for, fixed or adaptive
    accept_policy: str = "normal"  # "accept_all" / "reject_all" are for debugging and overhead


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: set[int] = field(default_factory=set)
    extra: dict = field(default_factory=dict)  # extra_config: sp_advice_prompt ids, sp_edit


def decode(
    target: Transformer,
    cache: KVCache,
    request: Request,
    stats: RequestStats,
    finish: Finish,
    spec: Speculation | None = None,
) -> Iterator[list[int]]:
    """Yield each iteration's new tokens; `finish.reason` says why it stopped.

    `cache` may already hold a prefix of the prompt (a chat's earlier turns): only the rest is
    prefilled.
    """
    params = request.params
    device = cache.layers[0][0].device
    generator = make_generator(params.seed, device)
    prompt = request.prompt_ids
    if cache.length >= len(prompt):
        cache.rollback(len(prompt) - 1)
    if cache.length < len(prompt) - 1:
        target(torch.tensor(prompt[cache.length : -1], device=device), cache, num_logits=1)
    if spec is not None:
        ctx = RequestContext(params=params, generator=generator, extra=request.extra, device=device)
        spec.proposer.begin(prompt, ctx)

    token, produced = prompt[-1], 0
    while True:
        room = min(params.max_new_tokens - produced, cache.max_len - cache.length)
        if room <= 0:
            finish.reason = "length"
            return
        drafts, draft_probs = [], None
        started = time.perf_counter()
        if spec is not None:
            k = min(spec.length.next_k(), room - 1)
            if k > 0:
                proposal = spec.proposer.propose(k)
                drafts, draft_probs = proposal.tokens, proposal.probs
            stats.draft_s += time.perf_counter() - started
        verify_started = time.perf_counter()
        logits = target(torch.tensor([token] + drafts, device=device), cache)

        if spec is None:
            accepted, token = 0, _pick(logits[0], params, generator)
        elif spec.accept_policy == "accept_all":
            accepted = len(drafts)
            token = _pick(logits[accepted], params, generator)
        elif spec.accept_policy == "reject_all":
            accepted, token = 0, _pick(logits[0], params, generator)
        else:
            accepted, token = spec.verifier(drafts, draft_probs, logits, params, generator)
        cache.rollback(cache.length - (len(drafts) - accepted))
        new = drafts[:accepted] + [token]
        stats.verify_s += time.perf_counter() - verify_started

        if spec is not None:
            spec.length.observe(len(drafts), accepted, stats)
            spec.proposer.observe(new)
        # A draft may carry an EOS that the target confirmed: stop right after it.
        for i, t in enumerate(new):
            if t in request.eos_ids and not params.ignore_eos:
                new = new[: i + 1]
                finish.reason = "stop"
                break
        produced += len(new)
        stats.record(len(drafts), accepted, len(new))
        yield new
        if finish.reason == "stop":
            return


def _pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The target's own next token: argmax, or one inverse-CDF draw from the warped distribution."""
    if params.greedy:
        return int(torch.argmax(logits))
    uniform = torch.rand((), generator=generator, device=generator.device)
    return sample(warp(logits, params), uniform)
