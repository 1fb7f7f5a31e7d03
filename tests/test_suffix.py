"""Suffix decoding through the real loop: lossless, learns across requests, and its cache file."""

import json
import random
import subprocess
import sys

import pytest
from test_sampling_exact import SAMPLES, SETTINGS, VOCAB, chi_square_pvalue, exact_distributions, models, sampled_counts  # noqa: F401

from speclite import LLM, SamplingParams
from speclite.api import SpecConfig
from speclite.errors import SpecliteError
from speclite.speculate.suffix import SuffixProposer
from speclite.speculate.suffix_tree import continuation

PROMPTS = ["def add(a, b):", '{"id": 1, "name":', "def add(a, b):\n    return a + b\n\ndef sub(a, b):",
           "x = [1, 2, 3]\ny = [1, 2, 3]\nz = ["]
GREEDY = SamplingParams(max_new_tokens=32, ignore_eos=True)

# Agent-like requests over similar records and a code edit: answers repeat earlier answers.
_RECORDS = ["alice", "bob", "carol", "dave", "erin", "frank"]
WORKLOAD = [[{"role": "user", "content": f"Write a Python function `load_{name}`: Load the record of {name} "
                                          "from the database and return it as a dict."}] for name in _RECORDS]
WORKLOAD.insert(3, [{"role": "user", "content": "Write a Python function `load_all`: rename `load` to `load_all` "
                                                 "in:\ndef load(self, name):\n    return self.db[name]\n"}])


def suffix_llm(model="tiny-code", k=8, **options) -> tuple[LLM, SuffixProposer]:
    llm = LLM(model, SpecConfig(method="suffix", k=k, options=options))
    return llm, llm.engine.spec.proposer


@pytest.fixture(scope="module")
def plain_outputs():
    llm = LLM("tiny-code")
    return {p: llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS}


@pytest.mark.parametrize("method", ["suffix", "hybrid"])
def test_a_stream_stopped_early_ends_before_the_next_request(plain_outputs, method):
    """A consumer that stops iterating (a stop string met, Ctrl-C, a client gone) ends its request
    there: its proposer's finish must not run later, when the collector reaches the abandoned
    iterations in the middle of the next request (it crashed suffix and hybrid)."""
    import gc

    llm = LLM("tiny-code", SpecConfig(method=method, k=4))
    for _ in llm.stream(PROMPTS[0], GREEDY):
        break
    stream = llm.stream(PROMPTS[1], GREEDY)
    first = next(stream)
    gc.collect()
    assert first.token_ids + [t for c in stream for t in c.token_ids] == plain_outputs[PROMPTS[1]]


@pytest.mark.parametrize("k", [1, 6])
def test_greedy_identical_to_plain_tiny_code(plain_outputs, k):
    llm, proposer = suffix_llm(k=k)
    accepted = 0
    for prompt in PROMPTS + PROMPTS:  # the second round drafts from the first round's answers too
        out = llm.generate(prompt, GREEDY)[0]
        assert out.token_ids == plain_outputs[prompt], (k, prompt)
        accepted += out.stats.accepted
    # Every answer joins the cache when its request ends (Proposer.finish), the last one included.
    assert accepted > 0 and proposer.responses.tokens == 2 * len(PROMPTS) * 32


def test_default_k_lets_long_repeats_through_in_few_verifications(plain_outputs):
    """No --gen-num-per-cycle: up to 32 drafts (vLLM's suffix default), only as many as a match carries."""
    llm = LLM("tiny-code", SpecConfig(method="suffix"))
    assert llm.spec_config.k == 32 and LLM("tiny-code", SpecConfig(method="suffix", k="auto")).engine.spec.length.k_max == 32
    iterations = []
    for prompt in PROMPTS + PROMPTS:  # the second round repeats the first round's answers
        out = llm.generate(prompt, GREEDY)[0]
        assert out.token_ids == plain_outputs[prompt], prompt
        iterations.append(out.aux_info["iter_count"])
    # With at most 4 drafts an iteration, 32 tokens take at least 7 iterations.
    assert min(iterations[len(PROMPTS):]) < 32 / 5, iterations


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_greedy_identical_to_plain_random_models(model_dirs, family):
    plain_llm = LLM(model_dirs[family])
    # vLLM's keys reach the same options.
    llm = LLM(model_dirs[family], {"method": "suffix", "num_speculative_tokens": 5, "suffix_decoding_max_tree_depth": 8,
                                   "suffix_decoding_max_spec_factor": 2.0, "suffix_decoding_min_token_prob": 0.05})
    proposed = 0
    for prompt in PROMPTS[:4]:
        out = llm.generate(prompt, GREEDY)[0]
        assert out.token_ids == plain_llm.generate(prompt, GREEDY)[0].token_ids, prompt
        proposed += out.stats.proposed
    assert proposed > 0


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_suffix_drafts_keep_the_target_distribution(models, name):  # noqa: F811
    """Drafts learned from earlier samples (deterministic, one-hot q) under rejection sampling."""
    target, _ = models
    params = SETTINGS[name]
    proposer = SuffixProposer(VOCAB, max_tree_depth=4, max_spec_factor=2.0, min_token_prob=0.0)
    pairs, thirds, accepted, proposed = sampled_counts(target, proposer, params)
    assert proposed > SAMPLES and 0.1 < accepted / proposed < 0.9, (accepted, proposed)
    joint, third = exact_distributions(target, params)
    assert chi_square_pvalue(pairs, joint) > 1e-4
    assert chi_square_pvalue(thirds, third) > 1e-4


def run_workload(llm, prompts):
    return [llm.generate(p, SamplingParams(max_new_tokens=48, ignore_eos=True))[0] for p in prompts]


def test_tokens_per_iteration_rise_as_the_cache_fills(tmp_path):
    llm, proposer = suffix_llm(suffix_cache=str(tmp_path / "suffix.json"))
    outs = run_workload(llm, WORKLOAD)
    rates = [o.aux_info["avg_tokens_per_iter"] for o in outs]
    assert rates[0] < 1.5  # cold: only the request's own repeats
    assert sum(rates[-3:]) / 3 > 2 * rates[0], rates
    assert len(proposer.responses.responses) == len(WORKLOAD)  # each joined when its request ended

    # A fresh process reading the file starts at the warm rate: exactly the figures the first
    # run had for the same next request.
    again = WORKLOAD[1]
    warm = llm.generate(again, SamplingParams(max_new_tokens=48, ignore_eos=True))[0]
    fresh, _ = suffix_llm(suffix_cache=str(tmp_path / "suffix.json"))
    first = fresh.generate(again, SamplingParams(max_new_tokens=48, ignore_eos=True))[0]
    assert first.token_ids == warm.token_ids
    assert first.aux_info["iter_count"] == warm.aux_info["iter_count"] < 48 / 2


def test_reset_keeps_learned_responses_and_forget_clears_them(tmp_path):
    llm, proposer = suffix_llm(k=4)
    run_workload(llm, WORKLOAD[:2])
    llm.engine.reset()
    assert len(proposer.responses.responses) == 2 and proposer.request is None
    proposer.forget()
    assert proposer.responses.tokens == 0
    # With a cache file, forget() (bench's, between repeats) goes back to what the file held, which
    # it never erases: the next save writes those responses and the new ones.
    cache = tmp_path / "suffix.json"
    _write(cache, GOOD)
    llm, proposer = suffix_llm(k=4, suffix_cache=str(cache))
    run_workload(llm, WORKLOAD[:2])
    proposer.forget()
    assert [r.tolist() for r in proposer.responses.responses] == GOOD["responses"] and cache.read_text()
    out = run_workload(llm, WORKLOAD[2:3])
    assert json.loads(cache.read_text())["responses"] == GOOD["responses"] + [out[0].token_ids]


def test_the_global_tree_off_leaves_the_cache_file_as_it_is(tmp_path):
    """--suffix-max-cached-requests 0 turns the earlier responses off: their file is not written over."""
    cache = tmp_path / "suffix.json"
    _write(cache, GOOD)
    llm, _ = suffix_llm(k=4, suffix_cache=str(cache), suffix_max_cached_requests=0)
    run_workload(llm, WORKLOAD[:2])
    assert json.loads(cache.read_text()) == GOOD


def test_a_cache_file_that_cannot_be_written_costs_no_answer(tmp_path, monkeypatch, caplog):
    """A full disk under --suffix-cache: said once, the answers stand, the file keeps what it held."""
    import speclite.files

    cache = tmp_path / "suffix.json"
    _write(cache, GOOD)
    llm, proposer = suffix_llm(k=4, suffix_cache=str(cache))

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(speclite.files.os, "fsync", full)
    outs = run_workload(llm, WORKLOAD[:3])
    assert all(len(o.token_ids) == 48 for o in outs) and len(proposer.responses.responses) == 4
    warnings = [r.getMessage() for r in caplog.records if "No space left on device" in r.getMessage()]
    assert len(warnings) == 1 and json.loads(cache.read_text()) == GOOD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suffix.json"]  # nothing staged left behind


def test_writers_sharing_a_cache_file_never_take_each_others_staged_file(tmp_path):
    """Two processes saving one --suffix-cache at once each write a file of their own and rename it:
    every save lands whole (the last one wins), none fails on a staged file the other renamed."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from speclite.speculate.suffix_cache import ResponseCache, read_responses\n"
        "cache = ResponseCache(8, -1)\n"
        "cache.add([int(sys.argv[2])] * 5)\n"
        "for _ in range(200):\n"
        "    cache.save(Path(sys.argv[1]), 4096)\n"
    )
    path = tmp_path / "suffix.json"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), str(i)], stderr=subprocess.PIPE, text=True)
             for i in (1, 2)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert json.loads(path.read_text())["responses"] in ([[1] * 5], [[2] * 5])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suffix.json"]


def test_eviction_bounds_the_cache():
    llm, proposer = suffix_llm(k=4, suffix_max_cached_requests=2)
    outs = run_workload(llm, WORKLOAD[:4])
    proposer.finish()
    assert [r.tolist() for r in proposer.responses.responses] == [o.token_ids for o in outs[-2:]]


def _write(path, body):
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        path.write_text(body if isinstance(body, str) else json.dumps(body))


GOOD = {"format": "speclite-suffix-cache", "version": 1, "vocab_size": 4096, "responses": [[1, 2, 3]]}
CORRUPT = {
    "binary": (b"\x00\x01\xffgarbage", "not JSON"),
    "truncated": (json.dumps(GOOD)[:-9], "not JSON"),
    "other JSON": ({"model_type": "qwen2"}, "no 'speclite-suffix-cache' header"),
    "a list": ([[1, 2, 3]], "no 'speclite-suffix-cache' header"),
    "newer version": ({**GOOD, "version": 2}, "version 2"),
    "other vocabulary": ({**GOOD, "vocab_size": 151936}, "vocabulary of 151936"),
    "token too large": ({**GOOD, "responses": [[1, 4096]]}, "corrupt"),
    "negative token": ({**GOOD, "responses": [[-1]]}, "corrupt"),
    "float token": ({**GOOD, "responses": [[1.5]]}, "corrupt"),
    "string token": ({**GOOD, "responses": [["a"]]}, "corrupt"),
    "responses not a list": ({**GOOD, "responses": {"a": 1}}, "corrupt"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_or_foreign_cache_file_is_one_line(tmp_path, case):
    body, message = CORRUPT[case]
    path = tmp_path / "cache.json"
    _write(path, body)
    with pytest.raises(SpecliteError) as err:
        SuffixProposer(4096, cache_file=path)
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_good_cache_file_loads(tmp_path):
    path = tmp_path / "cache.json"
    _write(path, GOOD)
    assert [r.tolist() for r in SuffixProposer(4096, cache_file=path).responses.responses] == [[1, 2, 3]]


@pytest.mark.parametrize("options, message", [
    ({"suffix_max_tree_depth": 0}, "--suffix-max-tree-depth must be at least 1"),
    ({"suffix_max_cached_requests": -2}, "--suffix-max-cached-requests must be -1"),
    ({"suffix_max_spec_factor": -1.0}, "--suffix-max-spec-factor must be >= 0"),
    ({"suffix_min_token_prob": 1.5}, "--suffix-min-token-prob must be in [0, 1]"),
    ({"suffix_cache": "/no/such/folder/cache.json"}, "not a writable file path"),
])
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(SpecliteError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SpecConfig(method="suffix", options=options).validated()


def test_cli_saves_the_cache_and_rejects_a_corrupt_one(tmp_path):
    """`speclite generate --sp-type suffix --suffix-cache FILE`: a run leaves its answers in FILE,
    the next run starts from them; a corrupt FILE is one line on stderr and exit status 1."""
    inp, out, cache = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "suffix.json"
    inp.write_text(json.dumps({"id": "a", "prompt": "def add(a, b):", "max_new_tokens": 12}) + "\n")
    args = [sys.executable, "-m", "speclite.cli", "generate", "--model", "tiny-code", "--sp-type", "suffix",
            "--suffix-cache", str(cache), "-i", str(inp), "-o", str(out)]
    run = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    answer = json.loads(out.read_text())
    assert json.loads(cache.read_text())["responses"] == [answer["token_ids"]]
    cache.write_text("{broken")
    out.unlink()
    run = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert run.stderr.strip().count("\n") == 0 and "not a speclite suffix cache" in run.stderr


@pytest.mark.parametrize("seed", range(20))
def test_draft_is_the_best_scoring_over_every_match_length(seed):
    """The pruned search returns what scoring every matched length would (ties: the longest)."""
    rng = random.Random(seed)
    factor, offset = rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 1.0])
    proposer = SuffixProposer(8, max_tree_depth=rng.randint(2, 10), max_spec_factor=factor, max_spec_offset=offset,
                              min_token_prob=rng.choice([0.0, 0.1, 0.3]))
    for _ in range(4):
        proposer.responses.add([rng.randrange(3) for _ in range(40)])
    proposer.begin([rng.randrange(3) for _ in range(30)], None)
    for _ in range(10):
        k = rng.randint(1, 8)
        for positions in ([(n, n.length) for n in proposer.growing.active], proposer.found[::-1]):
            best, best_score = [], 0.0
            for length in range(1, len(positions) + 1):
                limit = min(k, int(length * factor + offset + 1e-6))
                tokens, score = continuation(*positions[len(positions) - length], limit, proposer.min_prob)
                if tokens and score >= best_score:
                    best, best_score = tokens, score
            assert proposer._best(positions, k) == (best, pytest.approx(best_score))
        proposer.observe([rng.randrange(3)])
