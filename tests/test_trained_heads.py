"""The heads shipped for tiny-code (scripts/train_heads.py): aliases resolve, they load, drafting is exact."""

import json

import pytest

from speclite import LLM, SamplingParams, hub
from speclite.engine.stats import RequestStats
from speclite.hub import PACKAGE_DIR

HELDOUT = PACKAGE_DIR / "assets" / "heldout_prompts.jsonl"
GREEDY = SamplingParams(max_new_tokens=24)
SHIPPED = {"eagle3": "tiny-code-eagle3", "pard": "tiny-code-pard"}  # method -> alias (models.toml)


@pytest.fixture(scope="module")
def prompts():
    return [json.loads(line)["prompt"] for line in HELDOUT.read_text().splitlines()][:4]


@pytest.fixture(scope="module")
def plain(prompts):
    llm = LLM("tiny-code")
    return [llm.generate(p, GREEDY)[0].token_ids for p in prompts]


@pytest.mark.parametrize("alias", SHIPPED.values())
def test_alias_resolves_to_the_shipped_directory(alias):
    path = hub.resolve(alias)
    assert path == (PACKAGE_DIR / "assets" / alias).resolve()
    assert (path / "config.json").exists() and (path / "README.md").exists()


@pytest.mark.parametrize("method", SHIPPED)
def test_head_drafts_exactly_and_gets_accepted(method, prompts, plain):
    llm = LLM("tiny-code", {"method": method, "model": SHIPPED[method], "num_speculative_tokens": 4})
    total, outs = RequestStats(), []
    for p in prompts:
        out = llm.generate(p, GREEDY)[0]
        total.merge(out.stats)
        outs.append(out.token_ids)
    assert outs == plain
    # A trained head, not a random one (which stays near 1 token per iteration); see each model card.
    assert total.avg_tokens_per_iter > 1.3, total.aux_info()
