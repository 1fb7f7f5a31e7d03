"""Medusa through the real loop: the heads read the state of the row that produced the newest token;
greedy output equals plain decoding (chains and trees, both layouts, float32 and int4); sampled output
follows the target's exact distributions; `typical` accepts by its formula; the CLI end to end."""

import math
import random

import pytest
import torch

from conftest import cli_generate, save_model, decode_all
from medusa_heads import save_heads
from speclite.engine.loop import Speculation
from speclite.model import load_model
from speclite.model.step import Wants
from speclite.quant import quantize_model
from speclite.sampling import SamplingParams
from speclite.speculate.base import Proposal
from speclite.speculate.medusa import MedusaProposer, load_draft
from speclite.speculate.medusa.tree import parse_tree
from speclite.speculate.schedule import SpecLength
from speclite.speculate.verify import TYPICAL_DELTA, TYPICAL_EPSILON, typical
from test_sampling_exact import (VOCAB, chi_square_pvalue, exact_distributions, one_thread, sampled_counts,
                                 save_small_target)

GREEDY = SamplingParams(max_new_tokens=16, ignore_eos=True)
rng = random.Random(3)
PROMPTS = [[rng.randrange(300) for _ in range(rng.randrange(2, 12))] for _ in range(6)]
TREE = "[[0], [1], [0, 0], [0, 1], [2], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]"


def generate(target, prompt, spec=None, params=GREEDY):
    return decode_all(target, prompt, params, spec)


def save_target(path):
    save_model(path, "llama", seed=5, hidden=64, layers=4, intermediate_size=128)
    return load_model(path, "cpu", torch.float32)


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_target(tmp_path_factory.mktemp("medusa-loop"))


@pytest.fixture(scope="module")
def heads(tmp_path_factory, target):
    """Heads started from the target's lm_head, as Medusa trains them: they agree with it at times."""
    root = tmp_path_factory.mktemp("medusa-heads")
    for layout in ("medusa", "vllm", "vllm-target-head"):
        save_heads(root / layout, layout, 64, target.args.vocab_size, heads=4, seed=3, base=target.lm_head.weight)
    return root


def spec(target, head_dir, k, quant=None, **kw):
    return Speculation(MedusaProposer(load_draft(head_dir, target, quant), **kw), SpecLength(k))


def test_heads_read_the_state_of_the_row_before_the_newest_token(target, heads):
    """Each proposal uses the final state at position n - 2 of the n tokens so far (from scratch)."""
    seen = []

    class Recording(MedusaProposer):
        def begin(self, prompt_ids, ctx):
            self.seq = list(prompt_ids)
            super().begin(prompt_ids, ctx)

        def observe(self, tokens, states=None):
            self.seq += tokens
            super().observe(tokens, states)

        def propose(self, k):
            seen.append((list(self.seq), self.state.clone()))
            return super().propose(k)

    run = Speculation(Recording(load_draft(heads / "medusa", target)), SpecLength(3))
    generate(target, PROMPTS[0], run)
    assert len(seen) > 3
    for seq, state in seen:
        with torch.inference_mode():
            final = target.step(torch.tensor(seq), target.new_cache(64), wants=Wants(final=True)).final
        torch.testing.assert_close(state, final[len(seq) - 2], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout", ["medusa", "vllm", "vllm-target-head"])
def test_greedy_chain_and_tree_identical_to_plain(target, heads, layout):
    plain = [generate(target, p)[0] for p in PROMPTS]
    for k, kw in [(1, {}), (2, {}), (4, {}), (8, {}), (3, {"topk": 2}), (6, {"topk": 3}), (9, {"tree": parse_tree(TREE)}),
                  (5, {"tree": parse_tree(TREE)})]:
        s, accepted = spec(target, heads / layout, k, **kw), 0
        for i, prompt in enumerate(PROMPTS):
            out, stats = generate(target, prompt, s)
            assert out == plain[i], (layout, k, kw, i)
            accepted += stats.accepted
        assert accepted > 0, (layout, k, kw)  # some drafts stood, so accepted paths were kept too


def test_int4_target_and_int4_heads(tmp_path, heads):
    target = quantize_model(save_target(tmp_path), "int4", group_size=32)
    for layout in ("medusa", "vllm", "vllm-target-head"):
        for k, kw, quant in ((3, {}, None), (5, {"topk": 2}, "int4")):
            s = spec(target, heads / layout, k, quant, **kw)
            for prompt in PROMPTS[:3]:
                assert generate(target, prompt, s)[0] == generate(target, prompt)[0], (layout, kw, quant)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """test_sampling_exact's small-vocabulary target, and heads started from its lm_head."""
    root = tmp_path_factory.mktemp("medusa-small")
    model = save_small_target(root / "target", layers=2)
    save_heads(root / "heads", "medusa", 32, VOCAB, heads=2, seed=5, base=model.lm_head.weight)
    return load_model(root / "target", device="cpu"), root / "heads"


@pytest.mark.parametrize("kw, params", [({}, SamplingParams(temperature=1.0)),
                                        ({}, SamplingParams(temperature=0.8, top_k=3)),
                                        ({"topk": 2}, SamplingParams(temperature=0.8, top_k=3))],
                         ids=["sampled-chain-T1", "sampled-chain-topk3", "tree-topk3"])
def test_sampling_matches_target_distribution(small, params, kw):
    target, head_dir = small
    pairs, thirds, accepted, proposed = sampled_counts(target, MedusaProposer(load_draft(head_dir, target), **kw), params)
    # Drafts stand often enough to test both ways (a two-path tree of the heads' top 2: ~4%, 300 stood).
    assert 0.02 < accepted / proposed < 0.95, accepted / proposed
    joint, third = exact_distributions(target, params)
    assert chi_square_pvalue(pairs, joint) > 1e-4
    assert chi_square_pvalue(thirds, third) > 1e-4


def logits_of(*rows):
    """Logits whose softmax at temperature 1 is each given distribution."""
    return torch.log(torch.tensor(rows, dtype=torch.float64)).float()


def test_typical_acceptance_follows_its_formula():
    params, gen = SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)
    flat = [0.25] * 4  # entropy ln 4: threshold min(0.09, 0.3 / 4) = 0.075, every token passes
    peaked = [0.94, 0.02, 0.02, 0.02]  # low entropy: threshold 0.09, only token 0 passes
    h = -sum(p * math.log(p) for p in peaked)
    assert min(TYPICAL_EPSILON, TYPICAL_DELTA * math.exp(-h)) == TYPICAL_EPSILON
    mid = [0.5, 0.44, 0.03, 0.03]  # threshold 0.09: tokens 0 and 1 pass, not 2 or 3

    # A chain: drafts 3, 0 pass, then 2 fails under `mid`; the next token comes from that row.
    path, token = typical(Proposal([3, 0, 2]), logits_of(flat, peaked, mid, flat), params, gen)
    assert path == [0, 1] and token in range(4)
    path, _ = typical(Proposal([1]), logits_of(peaked, flat), params, gen)
    assert path == []
    # A tree: the longest passing path wins over an earlier, shorter one.
    tree = Proposal([0, 1, 2, 1], None, [-1, -1, 0, 1])  # [0] -> [0, 2]; [1] -> [1, 1]
    path, _ = typical(tree, logits_of(mid, mid, mid, flat, flat), params, gen)
    assert path == [1, 3]  # 0 passes but its child 2 fails; 1 passes under mid and its child under flat
    # Equal lengths: the likelier path under the target.
    tree = Proposal([1, 0, 0, 0], None, [-1, -1, 0, 1])
    path, _ = typical(tree, logits_of(mid, flat, flat, flat, flat), params, gen)
    assert path == [1, 3]
    # Temperature 0 is greedy verification.
    path, token = typical(Proposal([0, 0]), logits_of(peaked, mid, flat), SamplingParams(), gen)
    assert path == [0, 1] and token == 0


def test_typical_is_a_verifier_choice_through_the_loop(target, heads):
    s = spec(target, heads / "medusa", 4, topk=2)
    s.verify = "typical"
    out, stats = generate(target, PROMPTS[1], s, SamplingParams(max_new_tokens=24, temperature=0.7, seed=3))
    assert len(out) == 24 and stats.accepted > 0


def test_cli_generate_with_medusa_heads_equals_plain(tmp_path):
    """`speclite generate --sp-type medusa --draft HEADS`: the heads load from --draft, the tree flag
    reaches them, and the token ids equal plain decoding's."""
    target_dir, head_dir = tmp_path / "target", tmp_path / "heads"
    target = save_model(target_dir, "llama", seed=5, hidden=64, layers=4, intermediate_size=128)
    save_heads(head_dir, "medusa", 64, target.config.vocab_size, heads=3, seed=3, base=target.lm_head.weight)

    plain = cli_generate(target_dir, tmp_path, "plain.jsonl")
    tree = cli_generate(target_dir, tmp_path, "tree.jsonl", "--sp-type", "medusa", "--draft", str(head_dir),
                        "--gen-num-per-cycle", "5", "--medusa-tree", "[[0], [1], [0, 0], [0, 1], [0, 0, 0]]")
    assert {i: r["token_ids"] for i, r in tree.items()} == {i: r["token_ids"] for i, r in plain.items()}
    assert all(r["aux_info"]["accepted_per_position"] for r in tree.values())  # drafts were verified


def test_k_stops_at_the_drafts_the_heads_can_make(pair, tmp_path):
    """A chain drafts one token per head, a tree its paths: a larger k is an error (not a k shown but never
    run), and the default k and auto's ceiling stop there."""
    from speclite.api import LLM, SpecConfig
    from speclite.errors import SpecliteError
    from speclite.model.loader import read_config

    cfg = read_config(pair[0])
    save_heads(tmp_path, "medusa", cfg["hidden_size"], cfg["vocab_size"], heads=2, seed=1)
    with pytest.raises(SpecliteError, match="num_speculative_tokens 3: method medusa drafts at most 2 tokens"):
        LLM(pair[0], {"method": "medusa", "model": str(tmp_path), "num_speculative_tokens": 3})
    llm = LLM(pair[0], {"method": "medusa", "model": str(tmp_path)})
    assert llm.k_label == "2"  # the default k of 4, capped
    llm.set_k("auto")
    assert llm.engine.spec.length.k_max == 2
    with pytest.raises(SpecliteError, match="drafts at most 2"):
        llm.set_k(5)  # chat's /k
    tree = LLM(pair[0], SpecConfig("medusa", k=6, draft=str(tmp_path), options={"medusa_topk": 2}))
    assert tree.k_label == "6"  # 2 + 4 paths of ranks 0-1, one and two heads deep
    with pytest.raises(SpecliteError, match="drafts at most 6"):
        tree.set_k(7)
