"""Sampled speculative iterations many per C call (a draft model's sampled_run: speclite_draft_iterations
under rejection sampling, autoregressive and parallel): the same tokens, the same iterations and the
same caches as the loop's iterations one by one, which the chi-square tests of test_sampling_exact.py
hold to the target's exact distribution. Calls cut short after every iteration check that each call
leaves the generator where the iterations one by one would. Plain sampled chunks: test_cpu_sampling.py."""

import pytest

from speclite import SamplingParams
from speclite.engine import loop
from speclite.engine.loop import Request, Speculation, decode
from speclite.kernels import cpu_layer_ops
from speclite.speculate.draft_model import DraftModelProposer
from speclite.speculate.schedule import SpecLength
from conftest import RUN_STATS
from test_greedy_runs import spec_llm
from test_pard import PROMPTS, pard  # noqa: F401  (the pair's draft with a mask token named)

WARPS = [dict(temperature=0.8), dict(temperature=1.0, top_k=20, top_p=0.9), dict(temperature=0.6, top_p=0.7)]


def run_loop(llm, prompt: str, k: int, warp: dict, seed: int, eos: set[int], max_new: int):
    """The decode loop straight on an LLM's target and draft-model proposer: (tokens, stats, target
    cache length, the proposer's tokens, its cache's length)."""
    proposer, cache = llm.engine.spec.proposer, llm.target.new_cache(256)
    request = Request(llm.encode(prompt), SamplingParams(max_new_tokens=max_new, seed=seed, **warp), eos_ids=eos)
    run = decode(llm.target, cache, request, Speculation(proposer, SpecLength(k)))
    out = [t for new in run for t in new]
    return out, run.stats, cache.length, list(proposer.tokens), proposer.cache.length


def sampled_runs_match(llm, prompt: str, k: int, warp: dict, seed: int, monkeypatch, where) -> None:
    """No EOS, an EOS late in the output, a room of 13 tokens, and calls of one iteration each: the C
    calls' run (they ran) equals the loop's iterations one by one."""
    calls, real = [], cpu_layer_ops.draft_iterations

    def counting(*args):
        out = real(*args)
        calls.append(len(out[0]))
        return out

    with monkeypatch.context() as m:
        m.setattr(DraftModelProposer, "sampled_run", lambda *a: None)
        plain_out = run_loop(llm, prompt, k, warp, seed, set(), 40)[0]
    late = plain_out[max(i for i, t in enumerate(plain_out) if plain_out.index(t) == i)]
    for chunk, eos, room in ((loop.CHUNK_S, set(), 40), (loop.CHUNK_S, {late}, 40), (loop.CHUNK_S, set(), 13),
                             (1e-6, set(), 40)):
        with monkeypatch.context() as m:
            m.setattr(cpu_layer_ops, "draft_iterations", counting)
            m.setattr(loop, "CHUNK_S", chunk)
            ours = run_loop(llm, prompt, k, warp, seed, eos, room)
        assert sum(calls) > 1 or eos, (where, chunk, eos)
        assert chunk > 1e-3 or len(calls) == sum(calls), calls  # one iteration a call
        calls.clear()
        with monkeypatch.context() as m:
            m.setattr(DraftModelProposer, "sampled_run", lambda *a: None)
            theirs = run_loop(llm, prompt, k, warp, seed, eos, room)
        assert ours[0] == theirs[0], (where, chunk, eos, ours[0], theirs[0])
        for field in RUN_STATS:
            assert getattr(ours[1], field) == getattr(theirs[1], field), (where, chunk, eos, field)
        assert ours[2:] == theirs[2:], (where, chunk, eos)


@pytest.mark.parametrize("method", ["vanilla", "pard"])
@pytest.mark.parametrize("quant", [None, "int4"])
def test_sampled_runs_in_one_call_equal_the_iterations_one_by_one(isa, pard, method, quant, monkeypatch):
    target, draft, _ = pard  # the draft's vocabulary 16 rows past the target's: its logits cut
    for i, k in enumerate((1, 3, 8)):
        llm = spec_llm(target, draft, method, k, quant)
        sampled_runs_match(llm, PROMPTS[i], k, WARPS[i], k, monkeypatch, k)


def test_a_draft_with_a_smaller_vocabulary_is_padded(pard, monkeypatch):
    """The pair swapped: the draft lacks the target's last 16 rows (its logits padded with -inf, those
    tokens never drafted)."""
    target, draft, _ = pard
    llm = spec_llm(draft, target, "vanilla", 3)
    for i, prompt in enumerate(PROMPTS[:2]):
        sampled_runs_match(llm, prompt, 3, WARPS[i], i, monkeypatch, prompt)
