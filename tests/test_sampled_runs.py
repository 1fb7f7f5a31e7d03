"""Sampled speculative iterations many per C call (a draft model's sampled_run: speclite_draft_iterations
under rejection sampling, autoregressive and parallel): the same tokens, the same iterations and the
same caches as the loop's iterations one by one, which the chi-square tests of test_sampling_exact.py
hold to the target's exact distribution; calls cut short after every iteration check that each call
leaves the generator where the iterations one by one would. EAGLE-3's, MTP's and DFlash's sampled runs
are tested beside their greedy ones; plain sampled chunks in test_cpu_sampling.py."""

import pytest

from speclite.speculate.draft_model import DraftModelProposer
from conftest import SAMPLED_WARPS, runs_match
from test_greedy_runs import run_loop, spec_llm
from test_pard import PROMPTS, pard  # noqa: F401  (the pair's draft with a mask token named)


@pytest.mark.parametrize("method", ["vanilla", "pard"])
@pytest.mark.parametrize("quant", [None, "int4"])
def test_sampled_runs_in_one_call_equal_the_iterations_one_by_one(isa, pard, method, quant, monkeypatch):
    target, draft, _ = pard  # the draft's vocabulary 16 rows past the target's: its logits cut
    for i, k in enumerate((1, 3, 8)):
        llm = spec_llm(target, draft, method, k, quant)
        runs_match(lambda eos, room: run_loop(llm, PROMPTS[i], k, eos, room, SAMPLED_WARPS[i]), DraftModelProposer,
                   "draft_iterations", monkeypatch, 40, (k, PROMPTS[i]), sampled=True)


def test_a_draft_with_a_smaller_vocabulary_is_padded(pard, monkeypatch):
    """The pair swapped: the draft lacks the target's last 16 rows (its logits padded with -inf, those
    tokens never drafted)."""
    target, draft, _ = pard
    llm = spec_llm(draft, target, "vanilla", 3)
    for i, prompt in enumerate(PROMPTS[:2]):
        runs_match(lambda eos, room: run_loop(llm, prompt, 3, eos, room, SAMPLED_WARPS[i]), DraftModelProposer,
                   "draft_iterations", monkeypatch, 40, prompt, sampled=True)
