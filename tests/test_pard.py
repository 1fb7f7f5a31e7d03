"""PARD (`--sp-type pard`): one draft forward over the unseen committed tokens plus k-1 mask tokens
proposes k drafts. Greedy output equals plain decoding (float32, and int4 target with a quantized
draft), sampling keeps the target's exact distribution, the proposals equal the draft model run
from scratch on the whole sequence plus the masks (so its cache holds exactly the real tokens),
and a draft without a usable mask token is a one-line error."""

import json
import random
import shutil
import subprocess
import sys

import pytest
import torch

from speclite import LLM, SamplingParams
from speclite.api import SpecConfig
from speclite.errors import SpecliteError
from speclite.model import load_model
from speclite.speculate import RequestContext
from speclite.speculate.pard import ParallelDraftProposer
from speclite.speculate.schedule import AdaptiveSpecLength
from test_sampling_exact import SETTINGS, chi_square_pvalue, exact_distributions, models, sampled_counts  # noqa: F401

PROMPTS = ["def add(a, b):", "the quick brown", "import os\nimport sys\n", '{"id": 1, "name":',
           "for i in range(10):", "class Config:\n    name ="]
GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)


def with_config(src, dst, **keys):
    """A copy of a model directory with these config.json keys set."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **keys}))
    return dst


@pytest.fixture(scope="module")
def pard(pair, tmp_path_factory):
    """(target_dir, draft_dir, mask): the pair's noisy draft, whose vocabulary is padded by 16 rows,
    with its first padding row named as the mask token (`pard_token`, as amd/PARD-* checkpoints do)."""
    mask = json.loads((pair[0] / "config.json").read_text())["vocab_size"]
    return pair[0], with_config(pair[1], tmp_path_factory.mktemp("pard") / "draft", pard_token=mask), mask


@pytest.fixture(scope="module")
def plain(pair):
    llm = LLM(pair[0])
    return {p: llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS}


def pard_llm(target, draft, k, **extra):
    return LLM(target, {"method": "pard", "model": str(draft), "num_speculative_tokens": k, **extra})


def test_greedy_identical_to_plain_for_every_k(pard, plain):
    target, draft, _ = pard
    rates = []
    for k in range(1, 9):
        llm = pard_llm(target, draft, k)
        for prompt in PROMPTS[k % 2 :: 2]:
            out = llm.generate(prompt, GREEDY)[0]
            assert out.token_ids == plain[prompt], (k, prompt)
            rates.append(out.aux_info["accept_rate"])
    assert 0 < sum(rates) / len(rates) < 1, rates  # drafts are accepted and rejected


def test_static_steps_are_exact(pard, plain):
    """--static: the draft's one forward (pending tokens + masks, up to 2k rows) runs the fixed-shape step."""
    target, draft, _ = pard
    for k in (3, 8):
        llm = LLM(target, {"method": "pard", "model": str(draft), "num_speculative_tokens": k}, static=True)
        for prompt in PROMPTS[:3]:
            assert llm.generate(prompt, GREEDY)[0].token_ids == plain[prompt], (k, prompt)


def test_vllm_parallel_drafting_and_auto_k(pard, plain):
    """vLLM's spelling selects pard; `auto` k is exact."""
    target, draft, _ = pard
    llm = LLM(target, {"method": "draft_model", "parallel_drafting": True, "model": str(draft),
                       "num_speculative_tokens": "auto"})
    assert llm.spec_config.method == "pard"
    assert isinstance(llm.engine.spec.length, AdaptiveSpecLength)
    for prompt in PROMPTS[:3]:
        assert llm.generate(prompt, GREEDY)[0].token_ids == plain[prompt]
    assert SpecConfig.from_vllm({"method": "draft_model", "parallel_drafting": False,
                                 "model": "d"}).validated().method == "vanilla"
    with pytest.raises(SpecliteError, match="'parallel_drafting' applies to method 'vanilla'"):
        SpecConfig.from_vllm({"method": "eagle3", "parallel_drafting": True, "model": "d"})


def test_int4_target_and_int4_draft(pard):
    target, draft, _ = pard
    plain_int4 = LLM(target, quant="int4")
    llm = LLM(target, {"method": "pard", "model": str(draft), "num_speculative_tokens": 4, "quantization": "int4"},
              quant="int4")
    for prompt in PROMPTS[:3]:
        out = llm.generate(prompt, GREEDY)[0]
        assert out.token_ids == plain_int4.generate(prompt, GREEDY)[0].token_ids, prompt
        assert out.aux_info["accept_rate"] > 0


def test_proposals_equal_the_draft_run_from_scratch(pard):
    """After every iteration the draft's cache holds the committed tokens and nothing else: each
    proposal equals transformers' forward over the whole sequence plus the k-1 masks, and the cache
    equals a fresh prefill of the sequence."""
    from transformers import AutoModelForCausalLM

    target, draft_dir, mask = pard
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    reference = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    draft = load_model(draft_dir, "cpu", torch.float32)
    proposer = ParallelDraftProposer(draft, 128, vocab, mask)
    rng = random.Random(3)
    seq = [rng.randrange(vocab) for _ in range(7)]
    proposer.begin(list(seq), RequestContext(SamplingParams(), torch.Generator(), torch.device("cpu")))
    assert proposer.cache.length == 0  # the prompt waits for the loop's first drafting call (catch_up)
    proposer.catch_up()
    assert proposer.cache.length == len(seq) - 1  # the last token's logits are the first proposal's
    for _ in range(12):
        k = rng.randrange(1, 9)
        drafts = proposer.propose(k).tokens
        with torch.no_grad():
            logits = reference(torch.tensor([seq + [mask] * (k - 1)])).logits[0, -k:, :vocab]
        assert drafts == logits.argmax(-1).tolist(), (len(seq), k)
        assert proposer.cache.length == len(seq)
        fresh = draft.new_cache(128)
        with torch.inference_mode():
            draft(torch.tensor(seq), fresh)
        for (k_c, v_c), (k_f, v_f) in zip(proposer.cache.layers, fresh.layers):
            torch.testing.assert_close(k_c[:, : len(seq)], k_f[:, : len(seq)])
            torch.testing.assert_close(v_c[:, : len(seq)], v_f[:, : len(seq)])
        # The target keeps some drafts and adds its own token (random here: any outcome is possible).
        new = drafts[: rng.randrange(k + 1)] + [rng.randrange(vocab)]
        proposer.observe(new)
        seq += new


def test_rejection_sampling_matches_target_distribution(models):  # noqa: F811
    """Each draft is sampled from its own warped distribution (the mask rows' too) and verified
    against it: the output follows the target's warped distribution exactly."""
    target, draft = models
    vocab, params = target.args.vocab_size, SETTINGS["top-k 3, temperature 0.8"]
    pairs, thirds, accepted, proposed = sampled_counts(target, ParallelDraftProposer(draft, 16, vocab, vocab - 1),
                                                       params)
    assert 0.05 < accepted / proposed < 0.9, accepted / proposed
    joint, third = exact_distributions(target, params)
    assert chi_square_pvalue(pairs, joint) > 1e-4
    assert chi_square_pvalue(thirds, third) > 1e-4


def one_line_error(target, cfg) -> str:
    with pytest.raises(SpecliteError) as e:
        LLM(target, cfg)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_draft_without_a_usable_mask_token_is_a_one_line_error(pair, pard, tmp_path):
    from conftest import make_tokenizer, save_model

    target, draft, mask = pard
    assert "names no mask token" in one_line_error(target, {"method": "pard", "model": str(pair[1])})
    too_big = SpecConfig("pard", draft=str(draft), options={"mask_token_id": mask + 16})
    assert "not a token id of the draft" in one_line_error(target, too_big)
    bad = with_config(draft, tmp_path / "bad", pard_token="<mask>")
    assert "not a token id of the draft" in one_line_error(target, {"method": "pard", "model": str(bad)})
    save_model(tmp_path / "other", "qwen2", tokenizer=make_tokenizer(vocab_size=300), seed=3)
    other = with_config(tmp_path / "other", tmp_path / "other-pard", pard_token=0)
    assert "different tokenizers" in one_line_error(target, {"method": "pard", "model": str(other)})


def test_cli_generate_with_mask_token_flag_equals_plain(pair, stranger, tmp_path):
    """`speclite generate --sp-type pard --draft D --mask-token-id N` end to end, with a draft of
    another architecture and hidden size (a PARD draft needs only the tokenizer in common)."""
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(PROMPTS[:3])))

    def run(name, *flags):
        out = tmp_path / f"{name}.jsonl"
        r = subprocess.run([sys.executable, "-m", "speclite.cli", "generate", "--model", str(pair[0]), "-i", str(inp),
                            "-o", str(out), "--max-new-tokens", "16", *flags], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return [json.loads(line)["token_ids"] for line in out.read_text().splitlines()], r.stderr

    plain_ids, _ = run("plain")
    pard_ids, log = run("pard", "--sp-type", "pard", "--draft", str(stranger), "--mask-token-id", "5",
                        "--gen-num-per-cycle", "3")
    assert pard_ids == plain_ids
    assert "avg tokens / iteration" in log


def test_bench_runs_pard_beside_vanilla(pard, tmp_path):
    """`speclite bench --sp-type vanilla,pard`: the one draft serves both, pard reads its mask token
    from the draft's config, and every run's output equals plain decoding's."""
    from click.testing import CliRunner

    from speclite.cli import cli

    target, draft, _ = pard
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench", "--model", str(target), "--draft", str(draft), "--sp-type", "vanilla,pard",
                                      "--k", "2,4", "--prompts", "builtin:code", "--max-new-tokens", "8",
                                      "--threads", "1", "--repeats", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = {r["label"]: r for r in json.loads(out.read_text())["configs"]}
    assert {"pard k=2", "pard k=4"} <= set(rows), sorted(rows)
    assert all(r["same_as_plain"] for r in rows.values())
