"""Greedy speculative iterations many per C call (a proposer's greedy_run: speclite_draft_iterations for
draft models, autoregressive and parallel; EAGLE-3's in test_eagle3_loop.py): the same tokens, the
same iterations and the same caches and proposer state as the loop's iterations one by one; and
the loop's own iterations where the models are not whole in the kernels."""

import pytest

from speclite import LLM, SamplingParams
from speclite.engine.loop import Request, Speculation, decode
from speclite.kernels import cpu_build
from speclite.speculate.draft_model import DraftModelProposer
from speclite.speculate.schedule import SpecLength
from conftest import runs_match
from test_pard import GREEDY, PROMPTS, pard  # noqa: F401  (the pair's draft with a mask token named)


def spec_llm(target, draft, method: str, k: int, quant: str | None = None) -> LLM:
    extra = {"quantization": quant} if quant else {}
    return LLM(target, {"method": method, "model": str(draft), "num_speculative_tokens": k, **extra}, quant=quant)


def run_loop(llm, prompt: str, k: int, eos: set[int], max_new: int, warp: dict | None = None):
    """The decode loop straight on an LLM's target and draft-model proposer (greedy, or sampling with
    `warp`, seed 1): (tokens, stats, target cache length, the proposer's tokens, its cache's length and
    rows)."""
    proposer, cache = llm.engine.spec.proposer, llm.target.new_cache(256)
    params = SamplingParams(max_new_tokens=max_new, **({"seed": 1, **warp} if warp else {}))
    request = Request(llm.encode(prompt), params, eos_ids=eos)
    run = decode(llm.target, cache, request, Speculation(proposer, SpecLength(k)))
    out = [t for new in run for t in new]
    n = proposer.cache.length
    rows = [(kc[:, :n].clone(), vc[:, :n].clone()) for kc, vc in proposer.cache.layers]
    return out, run.stats, cache.length, list(proposer.tokens), n, rows


@pytest.mark.parametrize("method", ["vanilla", "pard"])
@pytest.mark.parametrize("quant", [None, "int4"])
def test_greedy_runs_in_one_call_equal_the_iterations_one_by_one(isa, pard, method, quant, monkeypatch):
    """The same tokens, the same iterations (drafts offered and accepted at each position), the caches
    and the proposer left in the same state; also where an EOS in a call's middle iteration ends the
    request, and where the room for new tokens ends a call."""
    target, draft, _ = pard
    eos_in_c = 0
    for k in range(1, 9):
        llm = spec_llm(target, draft, method, k, quant)
        for prompt in PROMPTS[k % 3 :: 3]:
            eos_in_c += runs_match(lambda eos, room: run_loop(llm, prompt, k, eos, room), DraftModelProposer,
                                          "draft_iterations", monkeypatch, 40, (k, prompt))
    assert eos_in_c >= 3


@pytest.mark.parametrize("method", ["vanilla", "pard"])
def test_greedy_run_declines_where_the_models_are_not_whole_in_the_kernels(pard, method, monkeypatch):
    """A forward hook on the draft (it must fire), or no CPU kernels: the loop's own iterations,
    with the same tokens."""
    target, draft, _ = pard
    llm = spec_llm(target, draft, method, 4)
    expected = llm.generate(PROMPTS[0], GREEDY)[0].token_ids
    proposer = llm.engine.spec.proposer
    seen = []
    handle = proposer.model.model.layers[0].register_forward_hook(lambda *a: seen.append(1))
    try:
        assert proposer.greedy_run(llm.target, llm.target.new_cache(64), 1, 4, 10, 10, set(), 1.0) is None
        assert llm.generate(PROMPTS[0], GREEDY)[0].token_ids == expected
        assert seen  # the hooked layer ran in Python
    finally:
        handle.remove()
    monkeypatch.setenv("SPECLITE_CPU_KERNELS", "0")
    cpu_build.isa.cache_clear()
    try:
        slow = spec_llm(target, draft, method, 4)
        assert slow.generate(PROMPTS[0], GREEDY)[0].token_ids == expected
        assert slow.engine.spec.proposer.greedy_run(slow.target, slow.target.new_cache(64), 1, 4, 10, 10, set(), 1.0) is None
    finally:
        monkeypatch.delenv("SPECLITE_CPU_KERNELS")
        cpu_build.isa.cache_clear()
