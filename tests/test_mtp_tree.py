"""MTP trees (SGLang's EAGLE knobs, as it runs NEXTN): greedy output equals plain decoding, sampled
output follows the target's exact warped distributions, bad tree values are one-line errors.
The CLI flags are checked end to end in test_mtp_loop.py."""

import pytest
import torch

from speclite.engine.loop import Speculation
from speclite.errors import SpecliteError
from speclite.model import load_model
from speclite.quant import quantize_model
from speclite.speculate import BuildContext, build_proposer, method_options
from speclite.speculate.schedule import SpecLength
from test_mtp_loop import PROMPTS, dirs, generate, proposer, small  # noqa: F401  (fixtures)
from test_sampling_exact import SETTINGS, chi_square_pvalue, exact_distributions, sampled_counts

# (topk, steps, num_draft_tokens, k)
TREES = [(2, 3, 5, 4), (3, 2, 7, 6), (2, 4, 9, 8), (2, 1, 3, 2)]


@pytest.mark.parametrize("target_name, module", [("deepseek", None), ("mimo", None), ("deepseek", "separate")])
def test_greedy_tree_identical_to_plain(dirs, target_name, module):
    target = load_model(dirs / target_name, "cpu", torch.float32)
    plain = [generate(target, p)[0] for p in PROMPTS]
    accepted = 0
    for topk, steps, n, k in TREES:
        tree = proposer(target, module and dirs / module, topk=topk, steps=steps, num_draft_tokens=n)
        for i, prompt in enumerate(PROMPTS):
            out, stats = generate(target, prompt, Speculation(tree, SpecLength(k)))
            assert out == plain[i], (target_name, module, topk, steps, n, i)
            accepted += stats.accepted
    assert accepted > 0  # drafts were verified and some stood


def test_int4_target_and_int4_module_tree(dirs):
    target = quantize_model(load_model(dirs / "deepseek", "cpu", torch.float32), "int4", group_size=32)
    spec = Speculation(proposer(target, None, "int4", topk=2, steps=3, num_draft_tokens=6), SpecLength(5))
    for prompt in PROMPTS[:3]:
        assert generate(target, prompt, spec)[0] == generate(target, prompt)[0]


@pytest.mark.parametrize("name", ["temperature 1", "top-k 3, temperature 0.8"])
def test_tree_sampling_matches_target_distribution(small, name):
    params = SETTINGS[name]
    tree = proposer(small, max_len=16, topk=2, steps=2, num_draft_tokens=5)
    pairs, thirds, accepted, proposed = sampled_counts(small, tree, params, 4)
    assert 0.05 < accepted / proposed < 0.9, accepted / proposed
    joint, third = exact_distributions(small, params)
    assert chi_square_pvalue(pairs, joint) > 1e-4
    assert chi_square_pvalue(thirds, third) > 1e-4


def test_registered_options_reach_the_proposer(dirs):
    target = load_model(dirs / "deepseek", "cpu", torch.float32)
    options = method_options("mtp", {"eagle_topk": "2", "eagle_steps": 3, "eagle_num_draft_tokens": 6})
    prop = build_proposer("mtp", BuildContext(options, target, None, 64))
    assert (prop.topk, prop.steps, prop.num_draft_tokens) == (2, 3, 6)
    assert method_options("mtp", {})["eagle_topk"] == 1  # a chain unless asked


@pytest.mark.parametrize("options, message", [
    ({"eagle_topk": 0}, "--eagle-topk must be at least 1, got 0"),
    ({"eagle_steps": 0}, "--eagle-steps must be at least 1, got 0"),
    ({"eagle_num_draft_tokens": 1}, "--eagle-num-draft-tokens must be at least 2, got 1"),
    ({"eagle_topk": "two"}, "--eagle-topk must be an integer, got 'two'"),
    ({"eagle_num_draft_tokens": 3}, "--eagle-num-draft-tokens sizes a tree (--eagle-topk 2 or more): a chain drafts "
                                    "--gen-num-per-cycle tokens (at most --eagle-steps)"),  # it would be ignored
])
def test_bad_tree_options_are_one_line_errors(options, message):
    with pytest.raises(SpecliteError) as e:
        method_options("mtp", options)
    assert str(e.value) == message
