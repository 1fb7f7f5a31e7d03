"""EAGLE-3 through the real loop: greedy output equals plain decoding (chains and trees, both layouts,
float32 and int4), and sampled output follows the target's exact warped distributions."""

import random

import pytest
import torch

from conftest import SAMPLED_WARPS, cli_generate, decode_all, runs_match, save_model
from eagle3_heads import save_head
from speclite.engine.loop import Request, Speculation, decode
from speclite.kernels import cpu_gemm
from speclite.model import load_model
from speclite.model.narrow import narrow
from speclite.quant import quantize_model
from speclite.sampling import SamplingParams
from speclite.speculate.eagle3 import Eagle3Proposer, load_draft
from speclite.speculate.schedule import SpecLength
from test_sampling_exact import VOCAB, chi_square_pvalue, exact_distributions, one_thread, sampled_counts, save_small_target

GREEDY = SamplingParams(max_new_tokens=16, ignore_eos=True)
rng = random.Random(7)
PROMPTS = [[rng.randrange(300) for _ in range(rng.randrange(3, 12))] for _ in range(4)]
# (topk, steps, num_draft_tokens, k)
TREES = [(2, 3, 5, 4), (3, 2, 7, 6), (2, 4, 9, 8), (2, 1, 3, 2)]


def generate(target, prompt, spec=None, params=GREEDY):
    return decode_all(target, prompt, params, spec)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("eagle3-loop")
    save_model(path, "llama", seed=5, hidden=64, layers=6, intermediate_size=128)
    return load_model(path, "cpu", torch.float32)


@pytest.fixture(scope="module")
def heads(tmp_path_factory, target):
    root = tmp_path_factory.mktemp("eagle3-heads")
    for layout, draft_vocab in (("specforge", None), ("speculators", 200)):
        save_head(root / layout, layout, 64, target.args.vocab_size, draft_vocab, seed=3, scale=4.0, inter=128)
    return root


def proposer(target, head_dir, quant=None, **tree):
    """The head as a drafter (its weights' bf16 values in bf16, loose products: AMX bf16 tiles where
    the CPU has them), as the CLI runs one."""
    head = load_draft(head_dir, target, quant)
    if quant is None:
        with torch.no_grad():
            for p in head.parameters():
                p.copy_(p.bfloat16())
        narrow(head)
    cpu_gemm.drafting([head], target)
    return Eagle3Proposer(head, target.model.embed_tokens, 64, target.args.vocab_size, **tree)


@pytest.mark.parametrize("layout", ["specforge", "speculators"])
def test_states_wait_for_a_call_that_drafts(target, heads, layout, monkeypatch):
    """Plain steps under the head (auto's k = 0) leave the target's states unfused: a request decoded
    plainly never runs fc. Fused before a call drafts, they are the rows one forward over the whole
    sequence gives, and the drafts land as before."""
    p = proposer(target, heads / layout)
    spec = Speculation(p, SpecLength(0))
    real, fused = p.head.fuse, []
    monkeypatch.setattr(p.head, "fuse", lambda x: fused.append(len(x)) or real(x))
    prompt = PROMPTS[1]
    out, stats = generate(target, prompt, spec)
    assert out == generate(target, prompt)[0] and stats.proposed == 0
    assert fused == [] and p.pending is None and len(p.waiting) >= 2
    with torch.inference_mode():
        whole = target.step(torch.tensor(prompt + out[:-1]), target.new_cache(64), wants=p.wants)
        expected = p._states(whole)
    p.catch_up()
    assert p.waiting == [] and torch.equal(p.pending, expected)
    spec.length = SpecLength(3)
    continued = prompt + out
    out2, _ = generate(target, continued, spec)  # the states standing from the request before
    q = proposer(target, heads / layout)
    fresh, _ = generate(target, continued, Speculation(q, SpecLength(3)))
    assert out2 == fresh == generate(target, continued)[0]
    for each in (p, q):
        each.catch_up()
    assert p.committed == q.committed > len(continued) and torch.equal(p.pending, q.pending)
    n = q.committed
    assert all(torch.equal(a[:, :n], b[:, :n]) for a, b in zip(p.cache.layers[0], q.cache.layers[0]))


@pytest.mark.parametrize("layout", ["specforge", "speculators"])
def test_greedy_chain_identical_to_plain(target, heads, layout):
    plain = {i: generate(target, p)[0] for i, p in enumerate(PROMPTS)}
    for k in (1, 2, 3, 5, 8):
        spec = Speculation(proposer(target, heads / layout), SpecLength(k))
        for i, prompt in enumerate(PROMPTS):
            assert generate(target, prompt, spec)[0] == plain[i], (layout, k, i)


@pytest.mark.parametrize("layout", ["specforge", "speculators"])
def test_greedy_tree_identical_to_plain(target, heads, layout):
    plain = {i: generate(target, p)[0] for i, p in enumerate(PROMPTS)}
    for topk, steps, n, k in TREES:
        spec = Speculation(proposer(target, heads / layout, topk=topk, steps=steps, num_draft_tokens=n),
                           SpecLength(k))
        for i, prompt in enumerate(PROMPTS):
            out, stats = generate(target, prompt, spec)
            assert out == plain[i], (layout, topk, steps, n, i)
            assert stats.proposed > 0


def run_loop(target, spec, prompt, eos, max_new, warp: dict | None = None):
    """The loop on one prompt (greedy, or sampling with `warp`, seed 1): (tokens, stats, the target
    cache's length, the proposer's tokens, its committed entries, its pending states, its cache's
    committed rows)."""
    cache, p = target.new_cache(96), spec.proposer
    params = SamplingParams(max_new_tokens=max_new, **({"seed": 1, **warp} if warp else {}))
    with torch.inference_mode():
        run = decode(target, cache, Request(prompt, params, eos_ids=eos), spec)
        out = [t for new in run for t in new]
    p.catch_up()  # the states still waiting to be fused
    rows = [x[:, : p.committed].clone() for x in p.cache.layers[0]]
    return out, run.stats, cache.length, list(p.tokens), p.committed, p.pending.clone(), rows


@pytest.mark.parametrize("quant", [None, "int4"])
def test_greedy_runs_in_one_call_equal_the_iterations_one_by_one(isa, tmp_path, heads, quant, monkeypatch):
    """Greedy decoding on the CPU kernels runs the head's chain, the target's pass, the acceptance and
    fc in one C call for many iterations (greedy_run): the same tokens and iterations (drafts offered
    and accepted at each position), the target's cache, the head's committed cache rows and pending
    states as the loop's iterations one by one; both layouts (one maps a smaller draft vocabulary),
    also where an EOS ends a call's middle iteration and where the room for new tokens ends a call."""
    save_model(tmp_path, "llama", seed=5, hidden=64, layers=6, intermediate_size=128)
    target = load_model(tmp_path, "cpu", torch.float32)
    if quant:
        target = quantize_model(target, quant, group_size=32)
    eos_in_c = 0
    for layout in ("specforge", "speculators"):
        for k in range(1, 9):
            spec = Speculation(proposer(target, heads / layout, quant), SpecLength(k))
            prompt = PROMPTS[k % len(PROMPTS)]
            eos_in_c += runs_match(lambda eos, room: run_loop(target, spec, prompt, eos, room), Eagle3Proposer,
                                          "head_iterations", monkeypatch, 48, (layout, k))
    assert eos_in_c >= 3


@pytest.mark.parametrize("quant", [None, "int4"])
def test_sampled_runs_in_one_call_equal_the_iterations_one_by_one(isa, tmp_path, heads, quant, monkeypatch):
    """Sampled decoding on the CPU kernels draws the head's chain from its warps over the target's
    vocabulary (one layout maps a smaller draft vocabulary) and judges it by rejection sampling in the
    same C call (sampled_run): the same tokens, iterations and state as the loop's iterations one by
    one (which the chi-square tests hold to the target's distribution)."""
    save_model(tmp_path, "llama", seed=5, hidden=64, layers=6, intermediate_size=128)
    target = load_model(tmp_path, "cpu", torch.float32)
    if quant:
        target = quantize_model(target, quant, group_size=32)
    for layout in ("specforge", "speculators"):
        for i, k in enumerate((1, 4, 8)):
            spec = Speculation(proposer(target, heads / layout, quant), SpecLength(k))
            warp, prompt = SAMPLED_WARPS[i], PROMPTS[k % len(PROMPTS)]
            runs_match(lambda eos, room: run_loop(target, spec, prompt, eos, room, warp), Eagle3Proposer,
                       "head_iterations", monkeypatch, 40, (layout, k), sampled=True)


def test_greedy_run_declines_trees_and_hooks(target, heads):
    """A tree, or a forward hook on fc (it must fire): no C run, the loop's own iterations (None)."""
    for tree, hook in (({"topk": 2, "steps": 3, "num_draft_tokens": 6}, False), ({}, True)):
        spec = Speculation(proposer(target, heads / "specforge", **tree), SpecLength(4))
        generate(target, PROMPTS[0], spec)  # the proposer now holds a request's states
        fired = []
        handle = spec.proposer.head.model.fc.register_forward_hook(lambda *a: fired.append(1)) if hook else None
        try:
            cache = target.new_cache(64)
            cache.length = len(spec.proposer.tokens) - 1
            assert spec.proposer.greedy_run(target, cache, spec.proposer.tokens[-1], 4, 8, 8, set(), 1.0) is None
            if hook:
                assert generate(target, PROMPTS[0], spec)[0] == generate(target, PROMPTS[0])[0] and fired
        finally:
            if handle:
                handle.remove()


def test_int4_target_and_int4_head(tmp_path, heads):
    save_model(tmp_path, "llama", seed=5, hidden=64, layers=6, intermediate_size=128)
    target = quantize_model(load_model(tmp_path, "cpu", torch.float32), "int4", group_size=32)
    for layout in ("specforge", "speculators"):
        for tree, k in (({}, 3), ({"topk": 2, "steps": 3, "num_draft_tokens": 6}, 5)):
            spec = Speculation(proposer(target, heads / layout, "int4", **tree), SpecLength(k))
            for prompt in PROMPTS[:2]:
                assert generate(target, prompt, spec)[0] == generate(target, prompt)[0], (layout, tree)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """test_sampling_exact's small-vocabulary target, so that a random head agrees with it often enough."""
    root = tmp_path_factory.mktemp("eagle3-small")
    save_small_target(root / "target", layers=4)
    save_head(root / "head", "speculators", 32, VOCAB, draft_vocab=6, seed=5, scale=3.0)
    with one_thread():
        yield load_model(root / "target", device="cpu"), root / "head"


@pytest.mark.parametrize("tree", [{}, {"topk": 2, "steps": 2, "num_draft_tokens": 5}], ids=["chain", "tree"])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=3)],
                         ids=["T1", "topk3"])
def test_sampling_matches_target_distribution(small, params, tree):
    target, head_dir = small
    proposer = Eagle3Proposer(load_draft(head_dir, target), target.model.embed_tokens, 16, VOCAB, **tree)
    pairs, thirds, accepted, proposed = sampled_counts(target, proposer, params, tree.get("num_draft_tokens", 3) - 1)
    assert 0.05 < accepted / proposed < 0.9, accepted / proposed
    joint, third = exact_distributions(target, params)
    assert chi_square_pvalue(pairs, joint) > 1e-4
    assert chi_square_pvalue(thirds, third) > 1e-4


def test_cli_generate_with_an_eagle3_head_equals_plain(tmp_path):
    """`speclite generate --sp-type eagle3 --draft HEAD` end to end: the head loads from --draft (no
    tokenizer of its own), the tree flags reach it, and the token ids equal plain decoding's."""
    import json

    target_dir, head_dir = tmp_path / "target", tmp_path / "head"
    save_model(target_dir, "llama", seed=5, hidden=64, layers=6, intermediate_size=128)
    vocab = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    save_head(head_dir, "specforge", 64, vocab, None, seed=3, scale=4.0, inter=128)

    plain = cli_generate(target_dir, tmp_path, "plain.jsonl")
    tree = cli_generate(target_dir, tmp_path, "tree.jsonl", "--sp-type", "eagle3", "--draft", str(head_dir),
                        "--gen-num-per-cycle", "4", "--eagle-topk", "2", "--eagle-steps", "3",
                        "--eagle-num-draft-tokens", "5")
    assert {i: r["token_ids"] for i, r in tree.items()} == {i: r["token_ids"] for i, r in plain.items()}
    assert all(r["aux_info"]["accepted_per_position"] for r in tree.values())  # drafts were verified


def test_the_tree_knobs_set_k_and_bound_it():
    """--eagle-num-draft-tokens N (a tree) and --eagle-steps S (a chain) are the drafts an iteration
    makes: the default k (N - 1, S), auto's ceiling, and the largest k allowed (N = 9 had run as 5)."""
    from speclite.api import LLM, SpecConfig
    from speclite.errors import SpecliteError

    def llm(k=None, **options):
        return LLM("tiny-code", SpecConfig("eagle3", k=k, draft="tiny-code-eagle3", options=options))

    assert llm(eagle_num_draft_tokens=9, eagle_topk=2).k_label == "8"
    assert llm(eagle_steps=3).k_label == "3" and llm().k_label == "4"
    assert llm("auto", eagle_num_draft_tokens=7, eagle_topk=2).engine.spec.length.k_max == 6
    assert llm(3, eagle_num_draft_tokens=9, eagle_topk=2).k_label == "3"  # a smaller k caps
    for k, options, most in ((6, {"eagle_num_draft_tokens": 5, "eagle_topk": 2}, 4), (5, {"eagle_steps": 3}, 3)):
        with pytest.raises(SpecliteError, match=f"drafts at most {most} tokens an iteration"):
            llm(k, **options)
