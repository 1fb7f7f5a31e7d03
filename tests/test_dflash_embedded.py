"""The shipped tiny-code-dflash drafter: loads through its alias and decodes exactly like the target alone."""

import json

import pytest

from speclite import LLM, SamplingParams, hub
from speclite.engine.stats import RequestStats
from speclite.hub import PACKAGE_DIR

HELDOUT = PACKAGE_DIR / "assets" / "heldout_prompts.jsonl"
GREEDY = SamplingParams(max_new_tokens=24)


@pytest.fixture(scope="module")
def prompts():
    return [json.loads(line)["prompt"] for line in HELDOUT.read_text().splitlines()][:4]


@pytest.fixture(scope="module")
def plain(prompts):
    llm = LLM("tiny-code")
    return [llm.generate(p, GREEDY)[0].token_ids for p in prompts]


def test_alias_names_a_dflash_drafter_for_the_target():
    draft = hub.resolve("tiny-code-dflash")
    cfg = json.loads((draft / "config.json").read_text())
    target = json.loads((hub.resolve("tiny-code") / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["hidden_size"] == target["hidden_size"]
    assert (draft / "model.safetensors").stat().st_size < 10e6


@pytest.mark.parametrize("k", [3, 7])
def test_greedy_equals_plain_and_drafts_are_accepted(prompts, plain, k):
    llm = LLM("tiny-code", {"method": "dflash", "model": "tiny-code-dflash", "num_speculative_tokens": k})
    total = RequestStats()
    for p, expected in zip(prompts, plain):
        out = llm.generate(p, GREEDY)[0]
        assert out.token_ids == expected
        total.merge(out.stats)
    assert total.avg_tokens_per_iter > 1.05, total.aux_info()  # drafts are accepted (1.22 at k=7, model card)
