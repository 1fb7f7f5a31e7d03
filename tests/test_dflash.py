"""DFlash (`--sp-type dflash`): a block drafter over the target's layer outputs proposes k drafts in
one forward. Proposals equal a float64 reference of the published block forward run from scratch
(so the drafter's cache holds exactly the committed context); greedy output equals plain decoding
(float32, and an int4 target with an int4 drafter); sampling keeps the target's exact distribution;
a drafter that does not fit the target is a one-line error."""

import json
import random
import subprocess
import sys

import pytest
import torch

from conftest import CLI_PROMPTS, SAMPLED_WARPS, cli_generate, save_model, decode_all, runs_match
from dflash_drafts import reference_block, save_drafter
from speclite import LLM, SamplingParams
from speclite.api import SpecConfig
from speclite.engine.loop import Speculation
from speclite.errors import SpecliteError
from speclite.model import load_model
from speclite.model.decoder import Linear
from speclite.model.step import Wants
from speclite.quant import quantize_model
from speclite.speculate import RequestContext
from speclite.speculate.dflash import DFlashProposer, load_draft
from speclite.speculate.schedule import AdaptiveSpecLength, SpecLength
from test_sampling_exact import VOCAB, chi_square_pvalue, exact_distributions, one_thread, sampled_counts, save_small_target

GREEDY = SamplingParams(max_new_tokens=16, ignore_eos=True)
rng = random.Random(5)
PROMPTS = [[rng.randrange(300) for _ in range(rng.randrange(2, 12))] for _ in range(6)]
IDS = (0, 2, 3)  # the last target layer's output too (Wants' num_layers row)


def generate(target, prompt, spec=None, params=GREEDY):
    return decode_all(target, prompt, params, spec)


def proposer(target, draft_dir, quant=None, max_len=64):
    return DFlashProposer(load_draft(draft_dir, target, quant), target.model.embed_tokens, target.lm_head, max_len)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target dir, drafter dir, drafter tensors, mask token): a 4-layer Qwen3 target, a 2-layer drafter."""
    root = tmp_path_factory.mktemp("dflash")
    save_model(root / "target", "qwen3", seed=5, hidden=64, layers=4)
    vocab = json.loads((root / "target" / "config.json").read_text())["vocab_size"]
    mask = vocab - 1
    tensors = save_drafter(root / "draft", 64, vocab, IDS, mask, seed=3, block_size=9)
    return root / "target", root / "draft", tensors, mask


@pytest.fixture(scope="module")
def target(pair):
    return load_model(pair[0], "cpu", torch.float32)


def test_states_wait_for_a_call_that_drafts(target, pair, monkeypatch):
    """Plain steps under the drafter (auto's k = 0) leave the target's states unfused: a request
    decoded plainly never runs fc; fused before a call drafts, they are the context rows one forward
    over the whole sequence gives."""
    p = proposer(target, pair[1])
    real, fused = p.draft.fuse, []
    monkeypatch.setattr(p.draft, "fuse", lambda x: fused.append(len(x)) or real(x))
    prompt = PROMPTS[2]
    out, stats = generate(target, prompt, Speculation(p, SpecLength(0)))
    assert out == generate(target, prompt)[0] and stats.proposed == 0
    assert fused == [] and p.pending.shape[0] == 0 and len(p.waiting) >= 2
    with torch.inference_mode():
        whole = target.step(torch.tensor(prompt + out[:-1]), target.new_cache(64), wants=p.wants)
        expected = p._context(whole)
    p.catch_up()
    assert p.waiting == [] and torch.equal(p.pending, expected)


def test_proposals_equal_the_reference_block_from_scratch(target, pair):
    """After every iteration the drafter's cache holds the context of exactly the committed
    positions: each proposal equals the float64 reference run on the target's states of the whole
    sequence plus the block [last token, mask, ...]."""
    _, draft_dir, tensors, mask = pair
    vocab = target.args.vocab_size
    wants = Wants(layers=tuple(i + 1 for i in IDS))

    def states(seq):
        with torch.inference_mode():
            step = target.step(torch.tensor(seq), target.new_cache(128), wants=wants)
        return step, torch.cat([step.layers[i + 1] for i in IDS], -1)

    p = proposer(target, draft_dir, max_len=128)
    r = random.Random(3)
    seq = [r.randrange(vocab) for _ in range(6)]
    step, _ = states(seq[:-1])
    p.begin(list(seq), RequestContext(SamplingParams(), torch.Generator(), torch.device("cpu"), prompt_states=step))
    for _ in range(8):
        k = r.randrange(1, 9)
        drafts = p.propose(k).tokens
        _, concat = states(seq)
        embeds = target.model.embed_tokens(torch.tensor([seq[-1]] + [mask] * k)).detach()
        ref = reference_block(tensors, concat[:-1], embeds, target.lm_head.weight.detach())
        assert drafts == ref.argmax(-1).tolist(), (len(seq), k)
        assert p.cache.length == len(seq) - 1
        new = drafts[: r.randrange(k + 1)] + [r.randrange(vocab)]  # the target keeps some drafts, adds its token
        fed, _ = states(seq + new)
        p.observe(new, fed.select(list(range(len(seq) - 1, len(seq) - 1 + len(new)))))
        seq += new
    # A new request sharing a prefix keeps that part of the context and recomputes the rest.
    prompt = seq[:9] + [7, 8]
    step, _ = states(prompt[:-1])
    p.begin(prompt, RequestContext(SamplingParams(), torch.Generator(), torch.device("cpu"),
                                   prompt_states=step.select(list(range(4, len(prompt) - 1))), prompt_from=4))
    _, concat = states(prompt)
    embeds = target.model.embed_tokens(torch.tensor([prompt[-1]] + [mask] * 3)).detach()
    assert p.propose(3).tokens == reference_block(tensors, concat[:-1], embeds,
                                                  target.lm_head.weight.detach()).argmax(-1).tolist()


def test_greedy_identical_to_plain_for_every_k(target, pair, small):
    """On the pair (random drafts are all rejected there) and on the small-vocabulary target, where
    about one draft in eight stands, so accepted blocks' states reach the context too."""
    small_target, small_draft = small
    s = random.Random(1)
    small_prompts = [[s.randrange(VOCAB) for _ in range(s.randrange(2, 8))] for _ in range(6)]
    accepted = 0
    for model, draft_dir, prompts in ((target, pair[1], PROMPTS), (small_target, small_draft, small_prompts)):
        plain = [generate(model, prompt)[0] for prompt in prompts]
        for k in range(1, 9):
            spec = Speculation(proposer(model, draft_dir), SpecLength(k))
            for i in range(k % 2, len(prompts), 2):
                out, stats = generate(model, prompts[i], spec)
                assert out == plain[i], (k, i)
                assert stats.proposed > 0
                accepted += stats.accepted
    assert accepted > 0


def run_loop(target, spec, prompt, eos, max_new, warp: dict | None = None):
    """The loop on one prompt (greedy, or sampling with `warp`, seed 1): (tokens, stats, the target
    cache's length, the proposer's tokens, its context entries, its pending rows, its cache's context
    rows)."""
    cache, p = target.new_cache(96), spec.proposer
    params = SamplingParams(max_new_tokens=max_new, **({"seed": 1, **warp} if warp else {}))
    out, stats = decode_all(target, prompt, params, spec, eos=eos, cache=cache)
    p.catch_up()  # the states still waiting to be fused
    n = p.cache.length
    rows = [(kc[:, :n].clone(), vc[:, :n].clone()) for kc, vc in p.cache.layers]
    return out, stats, cache.length, list(p.tokens), n, p.pending.clone(), rows


@pytest.mark.parametrize("quant", [None, "int4"])
def test_greedy_runs_in_one_call_equal_the_iterations_one_by_one(isa, pair, small, quant, monkeypatch):
    """Greedy decoding on the CPU kernels runs the context's injection, the block, the target's pass,
    the acceptance, fc and hidden_norm in one C call for many iterations (greedy_run): the same
    tokens and iterations, the target's cache, the drafter's context rows and pending rows as the
    loop's iterations one by one; on the pair (every draft rejected, the last layer's output among
    the states) and the small target (drafts stand), also where an EOS ends a call's middle
    iteration and where the room for new tokens ends a call."""
    eos_in_c = 0
    cases = ((pair[0], pair[1], PROMPTS), (small[1].parent / "target", small[1], [[3, 6, 2, 4], [5, 1]]))
    for target_dir, draft_dir, prompts in cases:
        model = load_model(target_dir, "cpu", torch.float32)
        if quant:
            model = quantize_model(model, quant, group_size=32)
        for k in range(1, 9):
            spec = Speculation(proposer(model, draft_dir, quant, max_len=96), SpecLength(k))
            prompt = prompts[k % len(prompts)]
            eos_in_c += runs_match(lambda eos, room: run_loop(model, spec, prompt, eos, room), DFlashProposer,
                                          "dflash_iterations", monkeypatch, 48, (draft_dir.name, k))
    assert eos_in_c >= 3


@pytest.mark.parametrize("quant", [None, "int4"])
def test_sampled_runs_in_one_call_equal_the_iterations_one_by_one(isa, pair, small, quant, monkeypatch):
    """Sampled decoding on the CPU kernels draws the block's drafts from their warps and judges them by
    rejection sampling in the same C call (sampled_run): the same tokens, iterations and state as the
    loop's iterations one by one (which the chi-square tests hold to the target's distribution)."""
    cases = ((pair[0], pair[1], PROMPTS), (small[1].parent / "target", small[1], [[3, 6, 2, 4], [5, 1]]))
    for target_dir, draft_dir, prompts in cases:
        model = load_model(target_dir, "cpu", torch.float32)
        if quant:
            model = quantize_model(model, quant, group_size=32)
        for i, k in enumerate((1, 3, 7)):
            spec = Speculation(proposer(model, draft_dir, quant, max_len=96), SpecLength(k))
            warp, prompt = SAMPLED_WARPS[i], prompts[k % len(prompts)]
            runs_match(lambda eos, room: run_loop(model, spec, prompt, eos, room, warp), DFlashProposer,
                       "dflash_iterations", monkeypatch, 40, (draft_dir.name, k), sampled=True)


def test_greedy_run_declines_where_a_hook_must_fire(target, pair):
    """A forward hook on fc: no C run (None), and the loop's own iterations give plain decoding's tokens."""
    spec = Speculation(proposer(target, pair[1]), SpecLength(4))
    generate(target, PROMPTS[0], spec)  # the proposer now holds a request's states
    fired = []
    handle = spec.proposer.draft.model.fc.register_forward_hook(lambda *a: fired.append(1))
    try:
        cache = target.new_cache(64)
        cache.length = len(spec.proposer.tokens) - 1
        assert spec.proposer.greedy_run(target, cache, spec.proposer.tokens[-1], 4, 8, 8, set(), 1.0) is None
        assert generate(target, PROMPTS[1], spec)[0] == generate(target, PROMPTS[1])[0] and fired
    finally:
        handle.remove()


def test_k_is_capped_at_the_block_size(target, pair):
    """block_size 9: never more than 8 drafts, however many are asked for."""
    spec = Speculation(proposer(target, pair[1]), SpecLength(20))
    _, stats = generate(target, PROMPTS[0], spec)
    assert len(stats.proposed_at) == 8  # the deepest draft of any iteration


def test_int4_target_and_int4_drafter(pair):
    target = quantize_model(load_model(pair[0], "cpu", torch.float32), "int4", group_size=32)
    for k in (2, 5, 8):
        spec = Speculation(proposer(target, pair[1], "int4"), SpecLength(k))
        for prompt in PROMPTS[:3]:
            assert generate(target, prompt, spec)[0] == generate(target, prompt)[0], k


def test_llm_vllm_config_draft_quant_and_auto_k(pair):
    """vLLM's `{"method": "dflash"}` with `quantization` (--draft-quant) and `auto` k is exact through LLM."""
    target_dir, draft_dir, _, _ = pair
    plain = LLM(target_dir, quant="int4")
    for k in (4, "auto"):
        llm = LLM(target_dir, {"method": "dflash", "model": str(draft_dir), "num_speculative_tokens": k,
                               "quantization": "int4"}, quant="int4")
        assert isinstance(llm.engine.spec.length, AdaptiveSpecLength) == (k == "auto")
        for prompt in ("def add(a, b):", "the quick brown"):
            params = SamplingParams(max_new_tokens=16, ignore_eos=True)
            assert llm.generate(prompt, params)[0].token_ids == plain.generate(prompt, params)[0].token_ids


@pytest.mark.parametrize("head", ["w8a8", "int4"])
def test_a_head_scheme_drafts_through_a_quantized_copy_of_the_targets_head(pair, head):
    # --draft-quant BODY/HEAD: the drafter has no head of its own, so it drafts through a copy of the
    # target's quantized to HEAD (the target keeps its own); exact, the copy's logits those of the
    # target's head quantized alike, and the copy counted in the proposer's resident memory.
    from speclite.quant.quantize import quantize_lm_head

    target_dir, draft_dir, _, _ = pair
    plain = LLM(target_dir)
    llm = LLM(target_dir, {"method": "dflash", "model": str(draft_dir), "num_speculative_tokens": 5,
                           "quantization": f"int4/{head}"})
    proposer = llm.engine.spec.proposer
    assert type(llm.target.lm_head) is Linear and proposer.lm_head is not llm.target.lm_head
    assert proposer.lm_head in proposer.resident()[0]
    expected = quantize_lm_head(load_model(target_dir, "cpu", torch.float32), head).lm_head
    x = torch.randn(3, llm.target.args.hidden_size)
    assert type(proposer.lm_head) is type(expected) and torch.equal(proposer.lm_head(x), expected(x))
    for prompt in ("def add(a, b):", "the quick brown", "import os\n"):
        params = SamplingParams(max_new_tokens=16, ignore_eos=True)
        assert llm.generate(prompt, params)[0].token_ids == plain.generate(prompt, params)[0].token_ids


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """test_sampling_exact's small-vocabulary target (4 layers) and a drafter of its shape."""
    root = tmp_path_factory.mktemp("dflash-small")
    save_small_target(root / "target", layers=4)
    save_drafter(root / "draft", 32, VOCAB, (1, 3), VOCAB - 1, heads=4, kv_heads=2, head_dim=8, seed=4)
    with one_thread():
        yield load_model(root / "target", device="cpu"), root / "draft"


def test_sampling_matches_target_distribution(small):
    """Top-k 3 at temperature 0.8: the drafts' warped distributions come back for rejection sampling."""
    target, draft_dir = small
    params = SamplingParams(temperature=0.8, top_k=3)
    pairs, thirds, accepted, proposed = sampled_counts(target, proposer(target, draft_dir, max_len=16), params)
    assert 0.05 < accepted / proposed < 0.9, accepted / proposed
    joint, third = exact_distributions(target, params)
    assert chi_square_pvalue(pairs, joint) > 1e-4
    assert chi_square_pvalue(thirds, third) > 1e-4


ERRORS = [  # (what is wrong, drafter arguments, config overrides, message part)
    ("hidden size", dict(hidden=32, head_dim=8), {}, "hidden size 32 but the target's is 64"),
    ("vocabulary", {}, dict(vocab_size=400), "vocabulary of 400 tokens"),
    ("layer ids", dict(ids=(0, 4)), {}, "reads target layers [0, 4]: the target has 4 layers"),
    ("no mask token", dict(mask=None), {}, "names no mask token"),
    ("mask outside", dict(mask=10_000), {}, "is not a token id of the target"),
    ("not DFlash", {}, dict(architectures=["Qwen3ForCausalLM"]), "is not a DFlash drafter"),
    ("sliding layers", {}, dict(layer_types=["sliding_attention"] * 2), "full, non-causal attention"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_drafter_that_does_not_fit_is_a_one_line_error(pair, tmp_path, case):
    _, args, overrides, message = case
    target_dir, _, _, mask = pair
    vocab = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    a = {"hidden": 64, "ids": IDS, "mask": mask, **args}
    save_drafter(tmp_path / "d", a.pop("hidden"), vocab, a.pop("ids"), a.pop("mask"), extra_config=overrides, **a)
    with pytest.raises(SpecliteError) as e:
        LLM(target_dir, SpecConfig("dflash", draft=str(tmp_path / "d")))
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_cli_generate_with_mask_token_flag_equals_plain(pair, tmp_path):
    """`speclite generate --sp-type dflash --draft D --mask-token-id N` end to end (the option pard
    shares); without the flag, that drafter (no mask token in its config) is one line on stderr."""
    target_dir, _, _, mask = pair
    vocab = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    save_drafter(tmp_path / "nomask", 64, vocab, IDS, None, seed=3, block_size=9)
    out = cli_generate(target_dir, tmp_path, "dflash.jsonl", "--sp-type", "dflash", "--draft", str(tmp_path / "nomask"),
                       "--mask-token-id", str(mask), "--gen-num-per-cycle", "6")
    llm = LLM(target_dir)
    for i, prompt in enumerate(CLI_PROMPTS):
        assert out[i]["token_ids"] == llm.generate(prompt, SamplingParams(max_new_tokens=12))[0].token_ids
    assert all(r["aux_info"]["accepted_per_position"] for r in out.values())
    r = subprocess.run([sys.executable, "-m", "speclite.cli", "generate", "--model", str(target_dir),
                        "-i", str(tmp_path / "cli-prompts.jsonl"), "-o", str(tmp_path / "x.jsonl"), "--sp-type", "dflash", "--draft", str(tmp_path / "nomask")], capture_output=True, text=True)
    assert r.returncode != 0 and "names no mask token" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
