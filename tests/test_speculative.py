"""Speculative decoding is lossless: greedy output equals plain decoding for every method and k."""

import json
import subprocess
import sys

import pytest

from speclite import LLM, SamplingParams
from speclite.engine import loop
from speclite.errors import SpecliteError

PROMPTS = ["def add(a, b):", "the quick brown", "import os\nimport sys\n", '{"id": 1, "name":',
           "for i in range(10):", "class Config:\n    name ="]
GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def plain_outputs(pair):
    llm = LLM(pair[0])
    return {p: llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS}


def spec_llm(pair, method, k, draft=None, **extra):
    cfg = {"method": method, "num_speculative_tokens": k, **extra}
    if method == "vanilla":
        cfg["model"] = str(draft or pair[1])
    return LLM(pair[0], cfg)


@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("method", ["naive", "vanilla", "deterministic"])
def test_greedy_identical_to_plain(pair, plain_outputs, method, k):
    llm = spec_llm(pair, method, k)
    for prompt in PROMPTS:
        out = llm.generate(prompt, GREEDY)[0]
        assert out.token_ids == plain_outputs[prompt], (method, k, prompt)
        assert out.aux_info["output_len"] == 40


@pytest.mark.parametrize("method", ["vanilla", "deterministic"])
def test_a_stop_string_ends_speculation_where_it_ends_plain_decoding(pair, method):
    # An iteration verifies several tokens at once; the output still ends with the token that completes
    # the stop string, as plain decoding's does: the same token ids, text and finish reason.
    plain, llm = LLM(pair[0]), spec_llm(pair, method, 5)
    checked = 0
    for prompt in PROMPTS:
        full = plain.generate(prompt, GREEDY)[0].text
        for start in range(2, len(full) - 3, 7):
            params = SamplingParams(max_new_tokens=40, ignore_eos=True, stop=[full[start : start + 3]])
            want, got = plain.generate(prompt, params)[0], llm.generate(prompt, params)[0]
            assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
            checked += want.finish_reason == "stop" and got.stats.iter_count < len(got.token_ids)
    assert checked > 10  # stops met inside iterations that verified several tokens


def test_draft_model_acceptance_is_partial(pair):
    """The test pair exercises full, partial and zero acceptance (else the equality tests prove little)."""
    llm = spec_llm(pair, "vanilla", 4)
    outs = llm.generate(PROMPTS, GREEDY)
    rates = [o.aux_info["accept_rate"] for o in outs]
    per_pos = [o.aux_info["accepted_per_position"] for o in outs]
    assert 0.2 < sum(rates) / len(rates) < 0.95, rates
    assert any(p[0] > p[-1] for p in per_pos)


def test_disagreeing_draft_is_still_exact(pair, stranger, plain_outputs):
    llm = spec_llm(pair, "vanilla", 3, draft=stranger)
    for prompt in PROMPTS[:3]:
        assert llm.generate(prompt, GREEDY)[0].token_ids == plain_outputs[prompt]


def test_static_steps_are_exact(pair, plain_outputs):
    llm = LLM(pair[0], {"method": "vanilla", "model": str(pair[1]), "num_speculative_tokens": 3}, static=True)
    plain = LLM(pair[0], static=True)  # plain greedy decoding steps one by one there: no chunks
    for prompt in PROMPTS[:3]:
        assert llm.generate(prompt, GREEDY)[0].token_ids == plain_outputs[prompt]
        assert plain.generate(prompt, GREEDY)[0].token_ids == plain_outputs[prompt]


def test_static_steps_sample_what_the_chunks_sample(pair):
    """Sampled decoding with fixed-shape steps (one by one) draws the tokens the kernels' chunks draw
    with the same seed, plain and speculative."""
    params = SamplingParams(max_new_tokens=24, temperature=0.9, top_k=50, seed=3)
    for spec in (None, {"method": "vanilla", "model": str(pair[1]), "num_speculative_tokens": 3}):
        static, chunked = LLM(pair[0], spec, static=True), LLM(pair[0], spec)
        for prompt in PROMPTS[:2]:
            assert static.generate(prompt, params)[0].token_ids == chunked.generate(prompt, params)[0].token_ids


@pytest.mark.parametrize("scheme", ["int4", "w8a8", "fp8-block", "nf4"])
def test_quantized_draft_is_exact(pair, plain_outputs, scheme):
    """A draft quantized at load time changes acceptance, never the output."""
    llm = spec_llm(pair, "vanilla", 4, quantization=scheme)
    assert llm.describe().count(scheme) == 1
    for prompt in PROMPTS[:3]:
        out = llm.generate(prompt, GREEDY)[0]
        assert out.token_ids == plain_outputs[prompt]
        assert out.aux_info["accept_rate"] > 0


def test_naive_equals_plain_when_sampling(pair):
    params = SamplingParams(max_new_tokens=30, temperature=0.9, top_k=20, seed=5, ignore_eos=True)
    plain = LLM(pair[0]).generate(PROMPTS[0], params)[0].token_ids
    assert spec_llm(pair, "naive", 0).generate(PROMPTS[0], params)[0].token_ids == plain


@pytest.mark.parametrize("k", [1, 3, 5])
def test_accept_all_and_reject_all(pair, k):
    params = SamplingParams(max_new_tokens=(k + 1) * 6, ignore_eos=True)
    out = spec_llm(pair, "vanilla", k, accept_policy="accept_all").generate(PROMPTS[0], params)[0]
    assert out.aux_info["avg_tokens_per_iter"] == k + 1 and out.aux_info["iter_count"] == 6
    out = spec_llm(pair, "vanilla", k, accept_policy="reject_all").generate(PROMPTS[0], params)[0]
    assert out.aux_info["avg_tokens_per_iter"] == 1.0 and out.aux_info["accept_rate"] == 0.0


def test_prompt_lookup_copies_from_the_advice(pair, plain_outputs):
    """Advice text holding the answer lets prompt lookup accept long runs, output unchanged."""
    llm = spec_llm(pair, "deterministic", 5)
    prompt = PROMPTS[1]
    answer = llm.tokenizer.decode(plain_outputs[prompt])
    without = llm.generate(prompt, GREEDY)[0]
    with_advice = llm.generate(prompt, GREEDY, {"sp_advice_prompt": answer})[0]
    assert with_advice.token_ids == without.token_ids == plain_outputs[prompt]
    assert with_advice.aux_info["avg_tokens_per_iter"] > without.aux_info["avg_tokens_per_iter"]


def test_speculative_edit_realigns_after_a_divergence(pair, plain_outputs):
    llm = spec_llm(pair, "deterministic", 4)
    prompt = PROMPTS[0]
    ids = plain_outputs[prompt]
    # The advice is the answer with two tokens changed in the middle: an edit to re-find. It is
    # given as token ids, since a random model's output need not survive decode -> encode.
    exact = llm.generate(prompt, GREEDY, {"sp_advice_ids": ids, "sp_edit": 1})[0]
    assert exact.token_ids == ids and exact.aux_info["avg_tokens_per_iter"] == 5.0
    edited = ids[:15] + [ids[15] + 1, ids[16] + 2] + ids[17:]
    out = llm.generate(prompt, GREEDY, {"sp_advice_ids": edited, "sp_edit": 1})[0]
    assert out.token_ids == ids
    # 40 tokens at k=4: 3 full passes, the divergence, then full passes again after re-aligning.
    assert out.aux_info["avg_tokens_per_iter"] >= 3.3, out.aux_info


def test_adaptive_k_is_exact_and_backs_off(pair, stranger, plain_outputs, monkeypatch):
    monkeypatch.setattr(loop, "CHUNK_S", 0.001)  # calls of a few iterations: auto decides once per call
    llm = spec_llm(pair, "vanilla", "auto", draft=stranger)
    # Enough tokens for several calls on a fast CPU too (a call runs until CHUNK_S has passed).
    out = llm.generate(PROMPTS[0], SamplingParams(max_new_tokens=200, ignore_eos=True))[0]
    assert out.token_ids[:40] == plain_outputs[PROMPTS[0]]
    # A draft that is never right costs time for nothing: k falls to 0 and only probes remain.
    assert llm.engine.spec.length.k == 0
    assert out.aux_info["iter_count"] > 40


def test_different_tokenizer_is_a_clear_error(pair, tmp_path):
    from conftest import make_tokenizer, save_model

    save_model(tmp_path, "qwen2", tokenizer=make_tokenizer(vocab_size=300), seed=3)
    with pytest.raises(SpecliteError, match="different tokenizers"):
        LLM(pair[0], {"method": "vanilla", "model": str(tmp_path)})


@pytest.mark.parametrize("sp_type", ["naive", "vanilla", "deterministic"])
def test_cli_generate_sp_type_equals_plain(pair, tmp_path, sp_type):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    results = {}
    for name, flags in [("plain", []), ("spec", ["--sp-type", sp_type, "--gen-num-per-cycle", "3"]
                                             + (["--draft", str(pair[1]), "--sp-quantization", "INT4"]
                                                if sp_type == "vanilla" else []))]:
        out = tmp_path / f"{name}.jsonl"
        r = subprocess.run([sys.executable, "-m", "speclite.cli", "generate", "--model", str(pair[0]), "-i", str(inp),
                            "-o", str(out), "--max-new-tokens", "24", *flags], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        results[name] = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["token_ids"] for r in results["spec"]] == [r["token_ids"] for r in results["plain"]]
    assert "avg tokens / iteration" in r.stderr
    if sp_type == "vanilla":  # the quant label is printed as text, not eaten as Rich markup
        assert "[INT4]" in r.stderr


def test_engine_reset_forgets_the_draft_prefix_too(pair, plain_outputs):
    llm = spec_llm(pair, "vanilla", 3)
    llm.generate(PROMPTS[0], GREEDY)
    proposer = llm.engine.spec.proposer
    assert proposer.cache.length > 0 and proposer.tokens
    llm.engine.reset()
    assert llm.engine.cache.length == 0 and proposer.cache.length == 0 and proposer.tokens == []
    assert llm.generate(PROMPTS[0], GREEDY)[0].token_ids == plain_outputs[PROMPTS[0]]


def test_adaptive_k_keeps_its_k_on_every_request_of_a_batch(pair, plain_outputs, monkeypatch):
    """k adapts to each iteration's own timings: a later request does not inherit the previous
    request's totals (which once drove k to 0 from the second request on)."""
    monkeypatch.setattr(loop, "CHUNK_S", 0.001)  # calls of a few iterations: auto decides once per call
    llm = spec_llm(pair, "deterministic", "auto")
    # Plain steps one by one, as this proposer's iterations run: on this tiny target a C chain of plain
    # steps costs about what a Python iteration of nine free drafts does, and either may then win.
    monkeypatch.setattr(llm.engine.target, "chain", lambda *args: None)
    length, asked = llm.engine.spec.length, []
    next_k = length.next_k
    monkeypatch.setattr(length, "next_k", lambda: asked.append(next_k()) or asked[-1])
    for prompt in PROMPTS[:4]:
        # The advice is the answer itself: free drafts, all accepted; k must stay high throughout
        # (how high, timings on a shared machine decide: a 9-row pass once measured 6x a 5-row one).
        out = llm.generate(prompt, GREEDY, {"sp_advice_ids": plain_outputs[prompt], "sp_edit": 1})[0]
        assert out.token_ids == plain_outputs[prompt]
        assert out.aux_info["avg_tokens_per_iter"] >= 3, (prompt, out.aux_info)
    later = asked[len(asked) // 2:]
    assert sum(later) / len(later) >= 4, asked
