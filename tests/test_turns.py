"""Requests that share a prefix with the one before (chat turns, a common system prompt) reuse the
target's and the proposer's caches, and every method still decodes exactly what plain decoding
does. The methods that draft from the target's hidden states keep fewer positions than the
target's cache does (an EAGLE-3 entry pairs a position with the token after it), so the prefill
recomputes the positions whose states they lack."""

import random

import pytest

from speclite.api import LLM
from speclite.sampling import SamplingParams

PARAMS = SamplingParams(max_new_tokens=12, ignore_eos=True)
DRAFTS = {"vanilla": "tiny-code-draft", "pard": "tiny-code-pard", "eagle3": "tiny-code-eagle3",
          "mtp": "tiny-code-mtp", "medusa": "tiny-code-medusa", "dflash": "tiny-code-dflash",
          "hybrid": "tiny-code-eagle3", "suffix": None, "deterministic": None}


def turns(llm, seed):
    """Token prompts in chat's pattern: each later one continues the one before and its answer, cut
    somewhere (inside the answer, right after the prompt, one token in) and extended."""
    rng = random.Random(seed)
    prompt = llm.encode("def fibonacci(n):\n    ")
    out = []
    for cut in ("all", "answer", "prompt", 1, "all", 0):
        keep = {"all": len(prompt) + len(out), "answer": len(prompt) + len(out) // 2, "prompt": len(prompt)}.get(cut, cut)
        prompt = (prompt + out)[:keep] + [rng.randrange(100, 4000) for _ in range(rng.randrange(1, 6))]
        out = yield prompt


def run(llm, seed=3):
    outs, gen = [], turns(llm, seed)
    prompt = next(gen)
    try:
        while True:
            outs.append(llm.engine.generate(prompt, PARAMS).token_ids)
            prompt = gen.send(outs[-1])
    except StopIteration:
        return outs


@pytest.fixture(scope="module")
def plain():
    return run(LLM("tiny-code"))


@pytest.mark.parametrize("method", list(DRAFTS))
def test_turns_sharing_prefixes_decode_as_plain(plain, method):
    llm = LLM("tiny-code", {"method": method, "num_speculative_tokens": 4, "model": DRAFTS[method]})
    assert run(llm) == plain


SEEDED = SamplingParams(max_new_tokens=40, temperature=1.2, seed=5, ignore_eos=True)


@pytest.mark.parametrize("method", [m for m in DRAFTS if m not in ("suffix", "hybrid")])  # those learn as they go
def test_seeded_sampling_repeats_and_a_stop_string_only_cuts(method):
    """A seeded request draws the same text when its prompt comes again (the target's cache then holds
    it: a method drafting from the target's states gets the state it drafts from recomputed, not its
    first iteration without drafts) and with a stop string, cut there (a call that stops early still
    drafts each iteration as many tokens as a call without the stop: the uniforms are taken alike)."""
    llm = LLM("tiny-code", {"method": method, "num_speculative_tokens": 4, "model": DRAFTS[method]})
    prompt = "def fibonacci(n):\n"
    full = llm.generate(prompt, SEEDED)[0].text
    assert llm.generate(prompt, SEEDED)[0].text == full
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert full.index(stop) > 20  # met after a few calls
    stopped = llm.generate(prompt, SamplingParams(**{**SEEDED.__dict__, "stop": [stop]}))[0].text
    assert stopped == full[: full.index(stop)]
