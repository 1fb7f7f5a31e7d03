"""--token-map (FR-Spec): a drafter's head over some tokens only. Its logits are the whole head's at
those tokens and -inf elsewhere; no draft ever leaves the map; greedy output stays plain decoding's for
every method that takes a map (the shipped pair's drafters, and an int4 target with an int4 draft);
the one-call runs equal the iterations one by one; sampling keeps the target's exact distribution;
`speclite token-map` counts a corpus as an independent count does; bad maps are one-line errors."""

import json
import random
import subprocess
import sys
from collections import Counter

import pytest
import torch

from speclite import LLM, SamplingParams, SpecConfig
from speclite.errors import SpecliteError
from speclite.hub import PACKAGE_DIR
from speclite.model import load_model
from speclite.model.decoder import Linear
from speclite.speculate import token_map
from speclite.speculate.draft_model import DraftModelProposer
from conftest import SAMPLED_WARPS, runs_match
from test_greedy_runs import run_loop
from test_pard import PROMPTS, pard  # noqa: F401  (the pair's draft with a mask token named)
from test_sampling_exact import VOCAB, chi_square_pvalue, exact_distributions, models, sampled_counts  # noqa: F401

HELDOUT = [json.loads(line)["prompt"] for line in (PACKAGE_DIR / "assets" / "heldout_prompts.jsonl").read_text().splitlines()]
GREEDY = SamplingParams(max_new_tokens=24)
SHIPPED = {"vanilla": "tiny-code-draft", "pard": "tiny-code-pard", "eagle3": "tiny-code-eagle3", "mtp": "tiny-code-mtp",
           "medusa": "tiny-code-medusa", "dflash": "tiny-code-dflash"}


def save_map(path, ids) -> str:
    token_map.save(list(ids), path)
    return str(path)


def spec_llm(method, k, path, target="tiny-code", draft=None, quant=None):
    """An LLM speculating with `method` (its shipped tiny-code drafter unless `draft`) and token map `path`."""
    return LLM(target, SpecConfig(method, k=k, draft=str(draft or SHIPPED[method]), draft_quant=quant,
                                  options={"token_map": path}), quant=quant)


@pytest.fixture(scope="module")
def plain():
    llm = LLM("tiny-code")
    return {p: llm.generate(p, GREEDY)[0].token_ids for p in HELDOUT[:4]}


def test_a_restricted_draft_computes_the_whole_heads_logits_at_its_tokens(pard):
    target, draft_dir, _ = pard
    draft = load_model(draft_dir, "cpu", torch.float32)
    vocab = draft.args.vocab_size
    keep = torch.tensor(sorted(random.Random(1).sample(range(vocab), vocab // 3)))
    view = draft.restricted(*token_map.restrict(draft.lm_head, None, keep, "the draft"))
    assert view.model is draft.model and view.lm_head.weight.shape[0] == keep.numel()
    ids = torch.tensor([random.Random(2).randrange(vocab) for _ in range(9)])
    with torch.inference_mode():
        full, part = draft(ids, draft.new_cache(32)), view(ids, view.new_cache(32))
    assert part.shape == full.shape
    torch.testing.assert_close(part[:, keep], full[:, keep], rtol=1e-5, atol=1e-5)
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[keep] = False
    assert torch.isneginf(part[:, outside]).all()
    assert draft.lm_head.weight.shape[0] == vocab  # the model itself keeps its whole head


@pytest.mark.parametrize("method", list(SHIPPED))
def test_greedy_output_is_plain_decodings_and_no_draft_leaves_the_map(method, plain, tmp_path):
    """With the 1024 most frequent training tokens: plain decoding's output, drafts accepted. With a map
    that leaves out every token of the plain outputs: still plain decoding's output, and no draft ever
    accepted (a draft from outside the map would be, the drafters being trained)."""
    frequent = str(PACKAGE_DIR / "assets" / "tiny-code" / "freq_1024.pt")
    produced = {t for ids in plain.values() for t in ids}
    elsewhere = save_map(tmp_path / "elsewhere.pt", sorted(set(range(4096)) - produced))
    for k, path in ((3, frequent), (4, elsewhere)):  # (the shipped Medusa heads draft 4 at most)
        llm = spec_llm(method, k, path)
        accepted = 0
        for prompt, expected in plain.items():
            out = llm.generate(prompt, GREEDY)[0]
            assert out.token_ids == expected, (method, k, prompt)
            accepted += out.stats.accepted
        assert (accepted > 0) == (path == frequent), (method, path, accepted)


def test_hybrid_passes_the_map_to_its_model_part(plain, tmp_path):
    """The MTP module drafts inside the map (none of its drafts stands where the map leaves out every
    token of the outputs) while the n-gram fillers draft freely; output stays plain decoding's."""
    produced = {t for ids in plain.values() for t in ids}
    elsewhere = save_map(tmp_path / "elsewhere.pt", sorted(set(range(4096)) - produced))
    llm = LLM("tiny-code", SpecConfig("hybrid", k=4, draft="tiny-code-mtp",
                                      options={"token_map": elsewhere, "hybrid_model_steps": 2}))
    parts = {}
    for prompt, expected in plain.items():
        out = llm.generate(prompt, GREEDY)[0]
        assert out.token_ids == expected, prompt
        for name, (drafted, stood) in out.stats.parts.items():
            parts.setdefault(name, [0, 0])[0] += drafted
            parts[name][1] += stood
    assert parts["mtp"][0] > 0 and parts["mtp"][1] == 0, parts
    assert llm.engine.spec.proposer.model.head.lm_head.weight.shape[0] == 4096 - len(produced)


@pytest.mark.parametrize("method,kernel", [("eagle3", "head_iterations"), ("mtp", "head_iterations"),
                                           ("dflash", "dflash_iterations")])
@pytest.mark.parametrize("sampled", [False, True])
def test_head_runs_in_one_call_equal_the_iterations_one_by_one(method, kernel, sampled, monkeypatch):
    """The drafters reading the target's states pick through the map in their C runs as the loop's
    iterations one by one do (greedy, and rejection sampling)."""
    for i, k in enumerate((2, 5)):
        llm = spec_llm(method, k, "freq_1024.pt")
        warp = SAMPLED_WARPS[i] if sampled else None
        runs_match(lambda eos, room: run_loop(llm, HELDOUT[i], k, eos, room, warp), type(llm.engine.spec.proposer),
                   kernel, monkeypatch, 40, (method, k), sampled=sampled)


def test_a_map_beside_the_target_is_found_by_its_file_name(plain):
    llm = spec_llm("pard", 4, "freq_1024.pt")
    prompt = HELDOUT[0]
    assert llm.generate(prompt, GREEDY)[0].token_ids == plain[prompt]
    assert llm.engine.spec.proposer.model.lm_head.weight.shape[0] == 1024


@pytest.mark.parametrize("method", ["vanilla", "pard"])
def test_int4_target_and_int4_draft(pard, method, tmp_path):
    target, draft, _ = pard
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    path = save_map(tmp_path / "m.json", random.Random(4).sample(range(vocab), vocab // 2))
    plain_llm = LLM(target, quant="int4")
    llm = spec_llm(method, 4, path, target, draft, quant="int4")
    for prompt in PROMPTS[:3]:
        params = SamplingParams(max_new_tokens=24, ignore_eos=True)
        out = llm.generate(prompt, params)[0]
        assert out.token_ids == plain_llm.generate(prompt, params)[0].token_ids, prompt
        assert 0 < out.aux_info["accept_rate"] < 1


@pytest.mark.parametrize("method", ["vanilla", "pard"])
@pytest.mark.parametrize("quant", ["int4/int4", "w8a8/w8a8"])
def test_a_draft_models_quantized_head_is_the_maps_rows_quantized(method, quant, plain):
    # --draft-quant BODY/HEAD quantizes the whole head at load; the drafting view's head is the map's rows
    # of the checkpoint's dense head, quantized to HEAD the same way (each row on its own, so the same
    # numbers as those rows of the whole head quantized).
    from speclite.quant.quantize import quantize_lm_head

    path = str(PACKAGE_DIR / "assets" / "tiny-code" / "freq_1024.pt")
    view = spec_llm(method, 4, path, quant=None).engine.spec.proposer.model  # the dense rows
    llm = LLM("tiny-code", SpecConfig(method, k=4, draft=SHIPPED[method], draft_quant=quant,
                                      options={"token_map": path}))
    quantized = llm.engine.spec.proposer.model
    assert torch.equal(quantized.vocab_map, token_map.load(path, 4096))
    expected = torch.nn.Module()
    expected.lm_head = view.lm_head
    quantize_lm_head(expected, quant.split("/")[1])
    assert type(quantized.lm_head) is type(expected.lm_head) is not Linear
    x = torch.randn(3, view.args.hidden_size)
    assert torch.equal(quantized.lm_head(x), expected.lm_head(x))
    for prompt in HELDOUT[:4]:
        assert llm.generate(prompt, GREEDY)[0].token_ids == plain[prompt]


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
@pytest.mark.parametrize("quant", ["int4/int4", "w8a8/w8a8"])
@pytest.mark.parametrize("mapped", [False, True])
def test_a_heads_quantized_head_is_its_dense_rows_quantized(method, quant, mapped, plain):
    # --draft-quant BODY/HEAD: an EAGLE-3 head drafts through its own lm_head (the map's rows of it), an
    # MTP module through a copy of the target's (the map's rows), quantized to HEAD from the dense rows;
    # the target keeps its dense head, and the copy counts in the proposer's resident memory.
    from speclite.quant.quantize import quantize_lm_head

    options = {"token_map": str(PACKAGE_DIR / "assets" / "tiny-code" / "freq_1024.pt")} if mapped else {}
    dense = LLM("tiny-code", SpecConfig(method, k=4, draft=SHIPPED[method], options=options)).engine.spec.proposer.head
    llm = LLM("tiny-code", SpecConfig(method, k=4, draft=SHIPPED[method], draft_quant=quant, options=options))
    proposer = llm.engine.spec.proposer
    head = proposer.head.output_head()
    assert type(llm.target.lm_head) is Linear and head is not llm.target.lm_head
    assert any(m is head for m in proposer.resident()[0][0].modules())
    assert torch.equal(proposer.head.target_ids, dense.target_ids)
    assert proposer.head.full_vocab == dense.full_vocab == (method == "mtp" and not mapped)
    expected = torch.nn.Module()
    expected.lm_head = Linear.holding(dense.output_head().weight.to(llm.target.dtype))
    quantize_lm_head(expected, quant.split("/")[1])
    assert type(head) is type(expected.lm_head) is not Linear
    x = torch.randn(3, llm.target.args.hidden_size)
    assert torch.equal(head(x), expected.lm_head(x))
    for prompt in HELDOUT[:4]:
        assert llm.generate(prompt, GREEDY)[0].token_ids == plain[prompt]


@pytest.mark.parametrize("method", ["vanilla", "pard"])
@pytest.mark.parametrize("sampled", [False, True])
def test_one_call_runs_equal_the_iterations_one_by_one(isa, pard, method, sampled, tmp_path, monkeypatch):
    target, draft, _ = pard
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    path = save_map(tmp_path / "m.pt", random.Random(5).sample(range(vocab), vocab // 2))
    for i, k in enumerate((1, 4, 8)):
        llm = spec_llm(method, k, path, target, draft)
        warp = SAMPLED_WARPS[i] if sampled else None
        runs_match(lambda eos, room: run_loop(llm, PROMPTS[i], k, eos, room, warp), DraftModelProposer,
                   "draft_iterations", monkeypatch, 40, (method, k), sampled=sampled)


def test_rejection_sampling_keeps_the_target_distribution(models):  # noqa: F811
    """The drafts come from the restricted head's warp (zero outside the map), and the output still
    follows the target's warped distribution exactly."""
    target, draft = models
    keep = torch.arange(0, VOCAB, 2)
    view = draft.restricted(*token_map.restrict(draft.lm_head, None, keep, "the draft"))
    params = SamplingParams(temperature=0.8, top_k=3)
    pairs, thirds, accepted, proposed = sampled_counts(target, DraftModelProposer(view, 16, VOCAB), params)
    assert 0.05 < accepted / proposed < 0.9, accepted / proposed
    joint, third = exact_distributions(target, params)
    assert chi_square_pvalue(pairs, joint) > 1e-4
    assert chi_square_pvalue(thirds, third) > 1e-4


def _error(cfg, quant=None) -> str:
    with pytest.raises(SpecliteError) as e:
        LLM("tiny-code", cfg, quant=quant)
    assert "\n" not in str(e.value)
    return str(e.value)


def _bad_maps(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "dict.json").write_text('{"a": 1}')
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "floats.json").write_text("[1.5, 2]")
    torch.save(torch.rand(4), tmp_path / "floats.pt")
    (tmp_path / "junk.pt").write_bytes(b"\x00junk")
    torch.save([3, 4096], tmp_path / "outside.pt")
    return [("missing.pt", "does not exist"), ("bad.json", "not a readable"), ("dict.json", "list of integer"),
            ("empty.json", "list of integer"), ("floats.json", "list of integer"), ("floats.pt", "list of integer"),
            ("junk.pt", "not a readable .pt or .json list of token ids (not a torch.save of a list)"),
            ("outside.pt", "outside the target's vocabulary of 4096")]


def test_bad_maps_are_one_line_errors(tmp_path):
    for name, message in _bad_maps(tmp_path):
        assert message in _error(SpecConfig("pard", draft="tiny-code-pard", options={"token_map": str(tmp_path / name)})), name
    draft_only = save_map(tmp_path / "eagle-none.pt", [4095])  # a token the EAGLE-3 head's 2048 do not hold
    assert "no token of the map" in _error(SpecConfig("eagle3", draft="tiny-code-eagle3",
                                                      options={"token_map": draft_only}))
    good = save_map(tmp_path / "good.pt", range(100))
    # The target's head quantized at load: an MTP module reading it has no dense rows to take.
    assert "restricts a dense head" in _error(SpecConfig("mtp", draft="tiny-code-mtp", options={"token_map": good}),
                                              quant="int4/int4")
    assert "takes no option token_map" in _error(SpecConfig("suffix", options={"token_map": good}))


def test_cli_errors_are_one_line_and_exit_nonzero(tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "def f():"}\n')
    for name, message in _bad_maps(tmp_path)[:3]:
        r = subprocess.run([sys.executable, "-m", "speclite.cli", "generate", "-m", "tiny-code", "--sp-type", "pard",
                            "--draft", "tiny-code-pard", "--token-map", str(tmp_path / name), "-i", str(prompts),
                            "-o", str(tmp_path / "out.jsonl")], capture_output=True, text=True)
        assert r.returncode != 0 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out.jsonl").exists() or not (tmp_path / "out.jsonl").read_text()


def test_token_map_command_counts_as_an_independent_count(tmp_path):
    from transformers import AutoTokenizer

    from click.testing import CliRunner

    from speclite.cli import cli

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [source.read_text() for source in sorted((PACKAGE_DIR / "speculate").glob("*.py"))[:6]]
    (corpus / "a.py").write_text(texts[0])
    (corpus / "more").mkdir()
    (corpus / "more" / "b.txt").write_text(texts[1])
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[2:4])
                                      + json.dumps({"prompt": texts[4]}) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(PACKAGE_DIR / "assets" / "tiny-code")
    counts = Counter(t for text in texts[:5] for t in tokenizer(text, add_special_tokens=False)["input_ids"])
    eos = json.loads((PACKAGE_DIR / "assets" / "tiny-code" / "generation_config.json").read_text())["eos_token_id"]
    eos = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}  # always in the map
    runner = CliRunner()
    for out in (tmp_path / "m.pt", tmp_path / "m.json"):
        result = runner.invoke(cli, ["token-map", "tiny-code", "--corpus", str(corpus), "--corpus", str(tmp_path / "c.jsonl"),
                                     "--size", "300", "-o", str(out)])
        assert result.exit_code == 0, result.output
        ids = token_map.load(out, 4096).tolist()
        ranked = [t for t in sorted(counts, key=lambda t: (-counts[t], t)) if t not in eos]
        assert ids == sorted(eos | set(ranked[: 300 - len(eos)]))
        assert f"{sum(counts[t] for t in ids) / sum(counts.values()):.1%}" in result.output
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"text": 1}\n')
    for args, message in ((["--corpus", str(corpus), "-o", str(tmp_path / "m.txt")], "name a .pt or .json file"),
                          (["--corpus", str(tmp_path / "empty.txt"), "-o", str(tmp_path / "n.pt")], "holds no text"),
                          (["--corpus", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "n.pt")], "bad.jsonl:1"),
                          # Refused before the corpus is counted, not by torch.save after it.
                          (["--corpus", str(corpus), "-o", str(tmp_path / "empty.txt" / "n.pt")],
                           "cannot write --output")):
        result = runner.invoke(cli, ["token-map", "tiny-code", *args])
        assert result.exit_code != 0 and message in str(result.exception), (args, result.output)


@pytest.mark.parametrize("layout", ["medusa", "vllm-target-head"])
def test_medusa_heads_restricted_own_or_shared(layout, tmp_path):
    """Heads with their own lm_heads, and heads sharing the target's: the whole heads' logits at the map's
    tokens, -inf elsewhere; a tree of them verified greedily stays plain decoding."""
    from conftest import decode_all, save_model
    from medusa_heads import save_heads
    from speclite.engine.loop import Speculation
    from speclite.speculate.medusa import MedusaProposer, load_draft
    from speclite.speculate.schedule import SpecLength

    save_model(tmp_path / "target", "llama", seed=5, hidden=64, layers=2, intermediate_size=128)
    target = load_model(tmp_path / "target", "cpu", torch.float32)
    vocab = target.args.vocab_size
    save_heads(tmp_path / "heads", layout, 64, vocab, heads=3, seed=3, base=target.lm_head.weight)
    keep = torch.tensor(sorted(random.Random(6).sample(range(vocab), vocab // 2)))
    whole, part = load_draft(tmp_path / "heads", target), load_draft(tmp_path / "heads", target)
    part.draft_through(keep, None, torch.float32)
    state = torch.randn(64)
    with torch.inference_mode():
        full, restricted = whole(state), part(state)
    torch.testing.assert_close(restricted[..., keep], full[..., keep], rtol=1e-5, atol=1e-5)
    assert torch.isneginf(restricted).sum() == restricted.shape[0] * (vocab - keep.numel())
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    quantized = load_draft(tmp_path / "heads", target, "int4", keep)  # own heads: restricted, then quantized
    assert layout != "medusa" or all(type(h.lm_head).__name__ == "Int4Linear" for h in quantized.heads)
    for heads in (part, quantized):
        for prompt in ([1, 5, 9], [7, 3, 3, 8, 2]):
            expected, _ = decode_all(target, prompt, params, None)
            ours, stats = decode_all(target, prompt, params, Speculation(MedusaProposer(heads, topk=2), SpecLength(5)))
            assert ours == expected and stats.proposed > 0


def test_a_map_on_the_hub_is_read_from_the_cache_and_offline_is_one_line(tmp_path):
    """`--token-map ORG/NAME/FILE`: huggingface_hub's cached copy (a cache laid out by hand, offline);
    a map not cached while the hub cannot be reached is a one-line error, exit 1."""
    import os

    snapshot = tmp_path / "hf" / "hub" / "models--someone--tiny-code-FR-Spec" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    token_map.save(list(range(4096)), snapshot / "freq_4096.pt")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n')
    # HF_HUB_CACHE too: it wins over HF_HOME, and GPTQModel's import sets it in this process (other tests).
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def generate(name, *flags):
        return subprocess.run([sys.executable, "-m", "speclite.cli", "generate", "-m", "tiny-code", "-i", str(prompts),
                               "-o", str(tmp_path / f"{name}.jsonl"), "--max-new-tokens", "12", *flags],
                              capture_output=True, text=True, env=env)

    plain = generate("plain")
    cached = generate("cached", "--sp-type", "pard", "--draft", "tiny-code-pard", "--token-map",
                      "someone/tiny-code-FR-Spec/freq_4096.pt")
    assert plain.returncode == 0 and cached.returncode == 0, cached.stderr
    ids = [json.loads((tmp_path / f"{n}.jsonl").read_text())["token_ids"] for n in ("plain", "cached")]
    assert ids[0] == ids[1]
    missing = generate("missing", "--sp-type", "pard", "--draft", "tiny-code-pard", "--token-map",
                       "someone/elsewhere-FR-Spec/freq_4096.pt")
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert "is not cached and the hub cannot be reached" in missing.stderr


def test_bench_runs_rows_with_and_without_a_map_side_by_side(tmp_path):
    """`speclite bench --token-map none,FILE`: one row per map for each method that takes one (a proposer
    each), one row for a method that does not; every output plain decoding's."""
    from click.testing import CliRunner

    from speclite.cli import cli

    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench", "-m", "tiny-code", "--sp-type", "pard,suffix", "--k", "2,4",
                                      "--token-map", "none,freq_1024.pt", "--prompts", "builtin:code",
                                      "--max-new-tokens", "8", "--threads", "1", "--repeats", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = {r["label"]: r for r in json.loads(out.read_text())["configs"]}
    assert set(rows) == {"plain", "suffix k=2", "suffix k=4", "pard k=2", "pard k=4", "pard k=2 map=freq_1024.pt",
                         "pard k=4 map=freq_1024.pt"}
    assert all(r["same_as_plain"] == r["runs"] for r in rows.values())
    assert rows["pard k=4 map=freq_1024.pt"]["peak_memory_bytes"] != rows["pard k=4"]["peak_memory_bytes"]
    # Two maps of one file name in different folders: two rows, each of its own runs.
    for folder, size in (("a", 1024), ("b", 256)):
        (tmp_path / folder).mkdir()
        shipped = token_map.load(PACKAGE_DIR / "assets" / "tiny-code" / "freq_1024.pt", 4096)
        token_map.save(shipped[:size].tolist(), tmp_path / folder / "f.pt")
    maps = f"{tmp_path / 'a' / 'f.pt'},{tmp_path / 'b' / 'f.pt'}"
    result = CliRunner().invoke(cli, ["bench", "-m", "tiny-code", "--sp-type", "pard", "--k", "2", "--token-map", maps,
                                      "--prompts", "builtin:code", "--max-new-tokens", "8", "--threads", "1",
                                      "--repeats", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = {r["label"]: r for r in json.loads(out.read_text())["configs"]}
    assert set(rows) == {"plain", f"pard k=2 map={tmp_path / 'a' / 'f.pt'}", f"pard k=2 map={tmp_path / 'b' / 'f.pt'}"}
    assert len({r["runs"] for r in rows.values()}) == 1


@pytest.mark.parametrize("error, says", [("LocalEntryNotFoundError", " is not cached and the hub cannot be reached: "),
                                         ("GatedRepoError", " is gated: accept its license"),
                                         ("RepositoryNotFoundError", ": no such repository on the hub (org/name)"),
                                         ("EntryNotFoundError", ": no such file in org/name")])
def test_hub_failures_are_one_line_for_a_model_and_for_a_file(error, says, monkeypatch):
    import httpx
    import huggingface_hub
    from huggingface_hub import errors

    from speclite import hub

    response = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co"))
    exc = getattr(errors, error)("x", **({"response": response} if error in ("GatedRepoError", "RepositoryNotFoundError") else {}))
    for call, target, what in ((lambda: hub.download("org/name"), "snapshot_download", "model 'org/name' (org/name)"),
                               (lambda: hub.fetch_file("org/name", "f.pt"), "snapshot_download", "'org/name/f.pt'")):
        monkeypatch.setattr(huggingface_hub, target, lambda *a, **k: (_ for _ in ()).throw(exc))
        with pytest.raises(SpecliteError) as e:
            call()
        assert str(e.value).startswith(what + says) and "\n" not in str(e.value), str(e.value)


def test_a_hub_file_is_its_snapshot_or_one_line_that_it_is_missing(tmp_path, monkeypatch):
    """fetch_file takes a snapshot of the one file (hf_hub_download retried for ~25 s offline)."""
    import huggingface_hub

    from speclite import hub

    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **k: asked.append((repo, k)) or str(tmp_path))
    (tmp_path / "f.pt").write_bytes(b"x")
    assert hub.fetch_file("org/name", "f.pt") == tmp_path / "f.pt"
    assert asked == [("org/name", {"allow_patterns": ["f.pt"]})]
    with pytest.raises(SpecliteError, match="^'org/name/g.pt': no such file in org/name$"):
        hub.fetch_file("org/name", "g.pt")
