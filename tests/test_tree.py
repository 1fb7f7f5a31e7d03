"""The target-step seam: hidden states beside the logits, token trees in one forward, KV compaction,
and greedy tree speculation through the real loop (output identical to plain decoding)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from speclite import LLM, SamplingParams
from speclite.engine.loop import Request, Speculation, decode
from speclite.model import load_model
from speclite.model.static import StaticDecoder
from speclite.model.step import Tree, Wants
from speclite.speculate import Proposal, Proposer
from speclite.speculate.schedule import SpecLength

GREEDY = SamplingParams(max_new_tokens=30, ignore_eos=True)
PROMPTS = ["def add(a, b):", "the quick brown", "import os\nimport sys\n", '{"id": 1, "name":']


@pytest.fixture(scope="module")
def target(pair):
    return load_model(pair[0], device="cpu")


def fresh_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor(ids), model.new_cache(64))


def test_hidden_states_match_transformers_prefill_and_decode(pair, target):
    hf = AutoModelForCausalLM.from_pretrained(str(pair[0]), dtype=torch.float32).eval()
    torch.manual_seed(3)
    ids = torch.randint(0, target.args.vocab_size, (12,))
    n = target.args.num_layers
    wants = Wants(final=True, layers=(0, 1, n))
    with torch.no_grad():
        ref = hf(ids[None], output_hidden_states=True).hidden_states  # [i] = input of layer i; [n] normed
        cache = target.new_cache(32)
        pre = target.step(ids[:9], cache, num_logits=1, wants=wants)  # prefill: every row, one pass
        dec = target.step(ids[9:], cache, wants=wants)
    for i in (0, 1):
        torch.testing.assert_close(torch.cat([pre.layers[i], dec.layers[i]]), ref[i][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.cat([pre.final, dec.final]), ref[n][0], rtol=1e-4, atol=1e-4)
    # The last layer's output before the norm: normed, it is the final state.
    torch.testing.assert_close(target.model.norm(dec.layers[n]), dec.final)
    assert pre.logits.shape[0] == 1 and dec.logits.shape[0] == 3
    for rows in ([2, 0], [0, 1], [0], [1, 2], torch.tensor([0, 1])):  # a chain's accepted prefix, or any rows
        picked = dec.select(rows)
        index = torch.as_tensor(rows)
        assert torch.equal(picked.final, dec.final[index]) and picked.logits.shape[0] == 0
        assert all(torch.equal(picked.layers[i], dec.layers[i][index]) for i in (0, 1, n))


# root -> 0, 1; 0 -> 2; 1 -> 3, 4; 3 -> 5
PARENTS = [-1, -1, 0, 1, 1, 3]


def rows_prefixes(parents, tokens):
    """Each row's token path after the committed sequence (row 0: none)."""
    paths = [[]]
    for i, parent in enumerate(parents):
        paths.append(paths[parent + 1] + [tokens[i]])
    return paths


def tree_pass(target, static: bool, seed: int, prompt_len: int):
    """A random prompt prefilled, then one pass over its last token plus a random PARENTS tree:
    (model, cache, prompt, drafts, the tree pass's Step, the cache length before it)."""
    torch.manual_seed(seed)
    prompt = torch.randint(0, target.args.vocab_size, (prompt_len,)).tolist()
    drafts = torch.randint(0, target.args.vocab_size, (len(PARENTS),)).tolist()
    cache = target.new_cache(64)
    model = StaticDecoder(target, cache) if static else target
    model.step(torch.tensor(prompt[:-1]), cache)
    start = cache.length
    step = model.step(torch.tensor(prompt[-1:] + drafts), cache, tree=Tree.of(PARENTS, "cpu"))
    return model, cache, prompt, drafts, step, start


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_tree_forward_equals_each_branch_from_scratch(target, static):
    _, _, prompt, drafts, step, _ = tree_pass(target, static, seed=4, prompt_len=7)
    for row, path in enumerate(rows_prefixes(PARENTS, drafts)):
        torch.testing.assert_close(step.logits[row], fresh_logits(target, prompt + path)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_kv_compaction_equals_recomputing_the_accepted_path(target, static):
    """Keep a path that is not the first branch (root -> 1 -> 3 -> 5); the next forward's logits
    equal those of the accepted sequence computed from scratch."""
    model, cache, prompt, drafts, _, start = tree_pass(target, static, seed=5, prompt_len=9)
    path = [1, 3, 5]
    cache.keep([start] + [start + 1 + i for i in path])
    accepted = prompt + [drafts[i] for i in path]
    assert cache.length == len(accepted)
    nxt = 17
    got = model.step(torch.tensor([nxt]), cache).logits[-1]
    torch.testing.assert_close(got, fresh_logits(target, accepted + [nxt])[-1], rtol=1e-4, atol=1e-4)


class OracleTree(Proposer):
    """Drafts a tree from the known greedy answer: each level puts a wrong token first and the right
    one second, so every accepted path runs through second branches."""

    name = "oracle_tree"

    def __init__(self, answers: dict, vocab: int):
        self.answers, self.vocab = answers, vocab
        self.wants = Wants(final=True, layers=(1,))
        self.seen_states = []

    def begin(self, prompt_ids, ctx):
        self.answer, self.done = self.answers[tuple(prompt_ids)], 0
        self.seen_states.append(ctx.prompt_states.final.shape[0])

    def propose(self, k):
        tokens, parents, parent = [], [], -1
        for level in range(k // 2):
            right = self.answer[self.done + level] if self.done + level < len(self.answer) else 0
            tokens += [(right + 1) % self.vocab, right]
            parents += [parent, parent]
            parent = len(tokens) - 1  # descend under the right one
        return Proposal(tokens, parents=parents)

    def observe(self, tokens, states=None):
        assert states.final.shape[0] == len(tokens) and states.layers[1].shape[0] == len(tokens)
        self.done += len(tokens)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_greedy_tree_speculation_equals_plain(pair, target, static):
    llm = LLM(pair[0])
    encoded = {p: llm.encode(p) for p in PROMPTS}
    plain = {p: llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS}
    proposer = OracleTree({tuple(encoded[p]): plain[p] for p in PROMPTS}, target.args.vocab_size)
    spec = Speculation(proposer, SpecLength(6))
    for p in PROMPTS:
        cache = target.new_cache(128)
        model = StaticDecoder(target, cache) if static else target
        with torch.inference_mode():
            run = decode(model, cache, Request(encoded[p], GREEDY), spec)
            out = [t for chunk in run for t in chunk]
        assert out == plain[p]
        # Three levels of (wrong, right) drafts, the right ones all taken: 4 tokens a pass (fewer at the end).
        assert run.stats.avg_tokens_per_iter > 3, run.stats.aux_info()
        assert run.stats.accepted_per_position[:3] == [1.0, 1.0, 1.0]
    assert proposer.seen_states == [len(encoded[p]) - 1 for p in PROMPTS]


def test_greedy_tree_verifier_takes_a_later_branch():
    from speclite.speculate import verify

    vocab = 8
    logits = torch.randn(len(PARENTS) + 1, vocab)
    best = logits.argmax(-1).tolist()
    # Root's first child wrong, second right; under it (row 2) first child (3) right; under 3, child 5 wrong.
    tokens = [(best[0] + 1) % vocab, best[0], 0, best[2], (best[2] + 3) % vocab, (best[4] + 1) % vocab]
    path, token = verify.greedy(Proposal(tokens, parents=PARENTS), logits, SamplingParams(), None)
    assert path == [1, 3] and token == best[4]
