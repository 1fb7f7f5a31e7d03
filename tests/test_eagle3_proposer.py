"""The EAGLE-3 proposer drafts what the head computes from scratch on the committed sequence.

A harness plays the loop: each iteration keeps an arbitrary number of the drafts (or a path of
the tree), appends the target's token, and hands the proposer the target's captured states of
the rows that stood. Every draft is checked against the float64 reference head run over the
whole sequence from scratch, so cache reuse, rollback and the pending pairs are all covered.
"""

import random

import pytest
import torch

from conftest import save_model
from eagle3_heads import reference_fuse, reference_head, save_head
from speclite.model.step import Step
from speclite.sampling import SamplingParams
from speclite.model.loader import load_model
from speclite.speculate.base import RequestContext
from speclite.speculate.eagle3.load import load_head
from speclite.speculate.eagle3.proposer import Eagle3Proposer

HIDDEN, LAYERS = 48, 6


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("eagle3-target")
    save_model(path, "llama", seed=5, hidden=HIDDEN, layers=LAYERS)
    return load_model(path, "cpu", torch.float32)


def run_target(model, seq):
    """(logits [n, V], {layer: its input [n, H]}) of the whole sequence, from scratch."""
    captured = {}
    hooks = [layer.register_forward_pre_hook(lambda m, a, i=i: captured.__setitem__(i, a[0].clone()))
             for i, layer in enumerate(model.model.layers)]
    try:
        with torch.inference_mode():
            logits = model(torch.tensor(seq), model.new_cache(len(seq) + 1))
    finally:
        for h in hooks:
            h.remove()
    return logits, captured


def reference_logits(model, head_t, seq, aux, extra=()):
    """float64 head logits after the committed `seq` and then the draft path `extra` (own states fed)."""
    _, caps = run_target(model, seq)
    fused = reference_fuse(head_t, torch.cat([caps[i] for i in aux], -1))[:-1]  # pairs (p, p + 1), p < n - 1
    embed = model.model.embed_tokens.weight.double()
    rows_tokens = list(seq[1:])
    states = fused
    logits, h = None, None
    for i in range(len(extra) + 1):
        n = len(rows_tokens)
        attend = torch.ones(n, n, dtype=torch.bool).tril()
        logits, h = reference_head(head_t, embed[rows_tokens], states, torch.arange(n), attend,
                                   vocab=embed.shape[0])
        if i < len(extra):
            rows_tokens.append(extra[i])
            states = torch.cat([fused, h[len(seq) - 2:]])  # each draft row takes the state of the row before
    return logits[-1]


def make(target, tmp_path, layout, draft_vocab=None, **kw):
    vocab = target.args.vocab_size
    t = save_head(tmp_path, layout, HIDDEN, vocab, draft_vocab, seed=11, scale=4.0)
    head = load_head(tmp_path, target.args, torch.device("cpu"), torch.float32)
    return t, head, Eagle3Proposer(head, target.model.embed_tokens, 128, vocab, **kw)


def greedy_ctx():
    return RequestContext(SamplingParams(max_new_tokens=8), torch.Generator().manual_seed(0), torch.device("cpu"))


def rows(caps, lo, hi):
    return Step(torch.empty(0, 1), layers={i: v[lo:hi] for i, v in caps.items()})


def begin(prop, seq, ctx, states, states_from=0):
    ctx.prompt_states, ctx.prompt_from = states, states_from
    prop.begin(seq, ctx)


def prefill(prop, target, seq, ctx=None):
    """As the loop does: the prefill runs the prompt but its last token, whose row comes with the first observe."""
    _, caps = run_target(target, seq[:-1])
    begin(prop, seq, ctx or greedy_ctx(), rows(caps, 0, len(seq) - 1))


@pytest.mark.parametrize("layout,draft_vocab", [("specforge", None), ("speculators", 200)])
def test_chain_drafts_match_reference(target, tmp_path, layout, draft_vocab):
    head_t, head, prop = make(target, tmp_path, layout, draft_vocab)
    rng = random.Random(0)
    seq = [rng.randrange(target.args.vocab_size) for _ in range(8)]
    prefill(prop, target, seq)
    for it in range(8):
        k = 1 + it % 5
        drafts = prop.propose(k).tokens
        assert len(drafts) == k
        for j, d in enumerate(drafts):
            ref = reference_logits(target, head_t, seq, head.aux_layers, drafts[:j])
            assert d == int(torch.argmax(ref)), (it, j)
        kept = rng.randrange(k + 1)  # any number may stand: the harness plays the verifier
        new = drafts[:kept] + [rng.randrange(target.args.vocab_size)]
        _, caps = run_target(target, seq + new)
        prop.observe(new, rows(caps, len(seq) - 1, len(seq) + kept))
        seq += new


@pytest.mark.parametrize("topk,steps,budget", [(2, 3, 5), (3, 2, 8), (2, 4, 7), (1, 4, 4)])
def test_tree_nodes_are_the_heads_topk_along_their_path(target, tmp_path, topk, steps, budget):
    head_t, head, prop = make(target, tmp_path, "specforge", topk=topk, steps=steps, num_draft_tokens=budget + 1)
    rng = random.Random(1)
    seq = [rng.randrange(target.args.vocab_size) for _ in range(7)]
    prefill(prop, target, seq)
    for it in range(5):
        p = prop.propose(budget)
        parents = getattr(p, "parents", None) or list(range(-1, len(p.tokens) - 1))
        assert len(p.tokens) == budget
        paths = []
        for i, (tok, par) in enumerate(zip(p.tokens, parents)):
            assert par < i
            path = paths[par] if par >= 0 else []
            paths.append(path + [tok])
            ref = reference_logits(target, head_t, seq, head.aux_layers, path)
            assert tok in torch.topk(ref, topk).indices.tolist(), (it, i)
            siblings = [t for t, q in zip(p.tokens[:i], parents[:i]) if q == par]
            assert tok not in siblings
        depth = max(len(x) for x in paths)
        assert depth <= steps
        # Keep a random root-to-node path (not necessarily the first branch) plus a fresh token.
        kept = paths[rng.randrange(len(paths))] if it % 2 else []
        new = kept + [rng.randrange(target.args.vocab_size)]
        _, caps = run_target(target, seq + new)
        prop.observe(new, rows(caps, len(seq) - 1, len(seq) + len(kept)))
        seq += new


@pytest.mark.parametrize("topk,steps", [(2, 3), (3, 3)])
def test_full_tree_expands_the_best_nodes_into_their_exact_topk(target, tmp_path, topk, steps):
    """With a budget holding every candidate, each expanded node's children are exactly the reference
    top-k at that node, and the expanded nodes of each depth are the top-k by cumulative log-prob."""
    head_t, head, prop = make(target, tmp_path, "speculators", 200, topk=topk, steps=steps, num_draft_tokens=100)
    seq = list(range(3, 12)) + [20]
    prefill(prop, target, seq)
    p = prop.propose(99)
    assert len(p.tokens) == topk + (steps - 1) * topk * topk
    paths, score = [], []
    for tok, par in zip(p.tokens, p.parents):
        path = paths[par] if par >= 0 else []
        lp = torch.log_softmax(reference_logits(target, head_t, seq, head.aux_layers, path), -1)
        paths.append(path + [tok])
        score.append((score[par] if par >= 0 else 0.0) + float(lp[tok]))
    for i, path in enumerate([[]] + paths):
        children = {p.tokens[j] for j, q in enumerate(p.parents) if q == i - 1}
        if children:
            ref = reference_logits(target, head_t, seq, head.aux_layers, path)
            assert children == set(torch.topk(ref, topk).indices.tolist()), path
    for depth in range(1, steps):
        nodes = [i for i, x in enumerate(paths) if len(x) == depth]
        expanded = {i for i in nodes if i in p.parents}
        assert expanded == set(sorted(nodes, key=lambda i: -score[i])[:topk]), depth


def test_new_turn_reuses_the_common_prefix(target, tmp_path):
    head_t, head, prop = make(target, tmp_path, "speculators")
    seq = list(range(5, 15)) + [30]
    prefill(prop, target, seq)
    prop.propose(3)
    # A new turn shares the first 8 tokens: the target's prefill recomputes the rows from 7 on.
    turn = seq[:8] + [40, 41, 42, 50]
    _, caps = run_target(target, turn)
    begin(prop, turn, greedy_ctx(), rows(caps, 7, len(turn) - 1), states_from=7)
    drafts = prop.propose(3).tokens
    for j, d in enumerate(drafts):
        assert d == int(torch.argmax(reference_logits(target, head_t, turn, head.aux_layers, drafts[:j])))


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=20, top_p=0.9)])
def test_sampled_chain_returns_the_heads_warped_distributions(target, tmp_path, params):
    from speclite.sampling import warp

    head_t, head, prop = make(target, tmp_path, "specforge", 200)
    seq = list(range(7, 16)) + [21]
    prefill(prop, target, seq, RequestContext(params, torch.Generator().manual_seed(3), torch.device("cpu")))
    p = prop.propose(4)
    assert len(p.tokens) == 4 and p.probs.shape == (4, target.args.vocab_size)
    for j, tok in enumerate(p.tokens):
        q = warp(reference_logits(target, head_t, seq, head.aux_layers, p.tokens[:j]).float(), params)
        torch.testing.assert_close(p.probs[j], q, rtol=1e-3, atol=1e-5)
        assert q[tok] > 0


def test_registered_method_builds_from_options(target, tmp_path):
    from speclite.speculate import BuildContext, build_proposer, get_method, method_options
    save_head(tmp_path, "speculators", HIDDEN, target.args.vocab_size, 200, seed=2)
    options = method_options("eagle3", {"eagle_topk": "2", "eagle_steps": 3, "eagle_num_draft_tokens": 6})
    prop = build_proposer("eagle3", BuildContext(options, target, None, 64, draft_dir=tmp_path))
    assert get_method("eagle3").needs_draft and not get_method("eagle3").draft_is_model and (prop.topk, prop.steps, prop.num_draft_tokens) == (2, 3, 6)
    prefill(prop, target, list(range(9)) + [1])
    p = prop.propose(8)
    assert len(p.tokens) == 5 and p.parents[:2] == [-1, -1]


@pytest.mark.parametrize("options,message", [({"eagle_topk": 0}, "--eagle-topk must be at least 1"),
                                             ({"eagle_num_draft_tokens": 1}, "at least 2"),
                                             ({"eagle_steps": "x"}, "--eagle-steps must be an integer")])
def test_bad_tree_options_are_one_line_errors(options, message):
    from speclite.errors import SpecliteError
    from speclite.speculate import method_options

    with pytest.raises(SpecliteError, match=message):
        method_options("eagle3", options)


def test_int4_head_on_int4_target_drafts_consistently(tmp_path):
    """Quantized (int4) head and target: the incremental drafts equal the same head's drafts computed
    with the whole sequence pending at once (the cache holds what a fresh pass computes)."""
    from speclite.quant import quantize_model
    from speclite.quant.linear import Int4Linear
    from speclite.speculate.eagle3 import load_draft

    save_model(tmp_path / "t", "llama", seed=6, hidden=64, layers=5, intermediate_size=128)
    target = quantize_model(load_model(tmp_path / "t", "cpu", torch.float32), "int4", group_size=32)
    save_head(tmp_path / "h", "specforge", 64, target.args.vocab_size, seed=8, scale=4.0, inter=128)
    head = load_draft(tmp_path / "h", target, "int4")
    assert isinstance(head.model.layers[0].self_attn.q_proj, Int4Linear)
    prop = Eagle3Proposer(head, target.model.embed_tokens, 128, target.args.vocab_size)
    rng = random.Random(4)
    seq = [rng.randrange(200) for _ in range(7)]
    prefill(prop, target, seq)
    for it in range(5):
        drafts = prop.propose(4).tokens
        fresh = Eagle3Proposer(head, target.model.embed_tokens, 128, target.args.vocab_size)
        prefill(fresh, target, seq)
        assert drafts == fresh.propose(4).tokens, it
        kept = rng.randrange(5)
        new = drafts[:kept] + [rng.randrange(200)]
        _, caps = run_target(target, seq + new)
        prop.observe(new, rows(caps, len(seq) - 1, len(seq) + kept))
        seq += new


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm_before_residual", [False, True])
@pytest.mark.parametrize("quant", [None, "int4"])
def test_greedy_chain_in_one_call_equals_the_head_steps_one_by_one(tmp_path, dtype, norm_before_residual, quant):
    """On the CPU a greedy chain runs in one C call (Eagle3Head.greedy_chain): the same drafts, bit
    for bit, as the head's steps one by one (kept by a hook on the head's layer), over iterations
    with rollbacks, a draft vocabulary mapped to target ids, bf16 and an int4 head."""
    from speclite.speculate.eagle3 import load_draft

    save_model(tmp_path / "t", "llama", seed=7, hidden=64, layers=5, intermediate_size=128)
    target = load_model(tmp_path / "t", "cpu", dtype)
    vocab = target.args.vocab_size
    save_head(tmp_path / "h", "specforge", 64, vocab, 200, seed=9, scale=4.0, inter=128,
              norm_before_residual=norm_before_residual)
    heads = [load_draft(tmp_path / "h", target, quant) for _ in range(2)]
    assert heads[0].cpu_layers(torch.zeros(1, 64, dtype=dtype)) is not None
    heads[1].model.layers[0].mlp.register_forward_hook(lambda *_: None)  # its steps go one by one
    assert heads[1].cpu_layers(torch.zeros(1, 64, dtype=dtype)) is None
    props = [Eagle3Proposer(h, target.model.embed_tokens, 128, vocab) for h in heads]
    rng = random.Random(5)
    seq = [rng.randrange(vocab) for _ in range(7)]
    for p in props:
        prefill(p, target, seq)
    for it in range(6):
        k = 2 + it % 4
        drafts = [p.propose(k).tokens for p in props]
        assert drafts[0] == drafts[1] and len(drafts[0]) == k, it
        kept = rng.randrange(k + 1)
        new = drafts[0][:kept] + [rng.randrange(vocab)]
        _, caps = run_target(target, seq + new)
        for p in props:
            p.observe(new, rows(caps, len(seq) - 1, len(seq) + kept))
        seq += new
