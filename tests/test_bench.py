"""`speclite bench`: the JSON's schema and arithmetic, accept_all, synthetic models, clear errors.

Speeds are never asserted (noisy shared machines); only how the figures relate to each other.
"""

from __future__ import annotations

import json
from dataclasses import replace
import statistics
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from conftest import save_model
from speclite.bench.prompts import BUILTIN, WORKLOADS, load_prompts
from speclite.bench.runner import BenchModels, Runner
from speclite.bench.sweep import BenchConfig, build_sweep, parse_ks, parse_methods
from speclite.cli import cli
from speclite.engine.memory import model_bytes, step_bytes
from speclite.errors import SpecliteError
from speclite.model import load_model
from speclite.quant.linear import QuantLinear
from speclite import LLM, SamplingParams

CONFIG_FIELDS = {
    "label", "method", "k", "quant", "accept_policy", "tokens_per_s", "tokens_per_s_runs", "plain_tokens_per_s",
    "speedup", "output_tokens", "iter_count", "avg_tokens_per_iter", "proposed", "accepted", "accept_rate",
    "proposed_at", "accepted_at", "accepted_per_position", "elapsed_s", "draft_s", "verify_s", "draft_share",
    "verify_share", "step_s", "peak_memory_bytes", "same_as_plain", "runs", "by_workload",
}
RUN_FIELDS = {"config", "repeat", "prompt", "workload", "output_tokens", "elapsed_s", "iter_count", "proposed",
              "accepted", "proposed_at", "accepted_at", "draft_s", "verify_s", "same_as_plain", "finish_reason"}
FAST = ["--threads", "1", "--repeats", "1"]


def bench(*args):
    result = CliRunner().invoke(cli, ["bench", *map(str, args)], catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def report(pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    target, draft = pair
    text = bench("--model", target, "--draft", draft, "--sp-type", "naive,vanilla,deterministic", "--k", "1,3",
                 "--prompts", "builtin:code,edit", "--max-new-tokens", 8, "--repeats", 2, "--threads", 1,
                 "--json", out)
    return json.loads(out.read_text()), text


def test_json_has_every_figure_and_speedup_is_a_ratio_of_the_same_run(report):
    data, text = report
    rows = {r["label"]: r for r in data["configs"]}
    assert list(rows) == ["plain", "naive", "vanilla k=1", "vanilla k=3", "deterministic k=1", "deterministic k=3"]
    prompts = [p for p in BUILTIN if p.workload in ("code", "edit")]
    assert len(data["runs"]) == len(rows) * len(prompts) * 2
    for row in rows.values():
        assert CONFIG_FIELDS <= set(row)
        runs = [r for r in data["runs"] if r["config"] == row["label"]]
        assert all(RUN_FIELDS <= set(r) for r in runs)
        per_repeat = [sum(r["output_tokens"] for r in runs if r["repeat"] == i) /
                      sum(r["elapsed_s"] for r in runs if r["repeat"] == i) for i in range(2)]
        assert row["tokens_per_s_runs"] == pytest.approx(per_repeat)
        assert row["tokens_per_s"] == pytest.approx(statistics.median(per_repeat))
        assert row["speedup"] == pytest.approx(row["tokens_per_s"] / rows["plain"]["tokens_per_s"])
        assert row["avg_tokens_per_iter"] == pytest.approx(row["output_tokens"] / row["iter_count"])
        assert 0 <= row["draft_share"] + row["verify_share"] <= 1
        # Greedy speculation is lossless: every run reproduces plain decoding's tokens.
        assert row["same_as_plain"] == row["runs"] == len(runs)
        assert set(row["by_workload"]) == {"code", "edit"}
    assert rows["plain"]["speedup"] == 1.0
    for label in ("plain", "naive"):
        assert rows[label]["proposed"] == 0 and rows[label]["avg_tokens_per_iter"] == 1.0
    assert len(rows["vanilla k=3"]["accepted_per_position"]) == 3
    assert rows["vanilla k=3"]["avg_tokens_per_iter"] > 1.0
    # The draft's weights and cache count for vanilla only.
    assert rows["vanilla k=1"]["peak_memory_bytes"] > rows["plain"]["peak_memory_bytes"] > 0
    assert rows["deterministic k=1"]["peak_memory_bytes"] == rows["plain"]["peak_memory_bytes"]
    meta = data["meta"]
    assert meta["memory_kind"] == "weights+KV" and meta["process_peak_rss_bytes"] > 0
    assert meta["repeats"] == 2 and meta["max_new_tokens"] == 8 and meta["threads"] == 1
    roof = data["rooflines"][""]
    assert roof["measured_step_s"] == pytest.approx(rows["plain"]["step_s"]) and roof["roofline_step_s"] > 0
    assert "vanilla k=3" in text and "roofline" in text


def test_accept_all_emits_k_plus_one_tokens_per_iteration(pair, tmp_path):
    out = tmp_path / "b.json"
    target, draft = pair
    bench("--model", target, "--draft", draft, "--sp-type", "vanilla,deterministic", "--k", 2, "--accept-policy",
          "accept_all", "--ignore-eos", "--max-new-tokens", 9, "--prompts", "builtin:json", *FAST, "--json", out)
    rows = {r["label"]: r for r in json.loads(out.read_text())["configs"]}
    vanilla = rows["vanilla k=2 (accept_all)"]
    assert vanilla["avg_tokens_per_iter"] == 3.0 and vanilla["accepted_per_position"] == [1.0, 1.0]
    assert vanilla["output_tokens"] == 9 * 3


def small_synthetic_config(tmp_path):
    """A real config's layout with small dimensions keeps a test quick; shipped names work the same."""
    from speclite.synthetic import synthetic_config

    cfg = synthetic_config("qwen2.5-0.5b") | {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                                              "num_key_value_heads": 2, "vocab_size": 8192}
    path = tmp_path / "small.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("static", [[], ["--static"]], ids=["dynamic", "static"])
def test_synthetic_pair_with_roofline(tmp_path, static):
    # --static: the draft's fixed-shape steps (CUDA graphs on a GPU, eager here) as well as the target's
    path = small_synthetic_config(tmp_path)
    out = tmp_path / "s.json"
    text = bench("--synthetic", path, "--synthetic-draft", path, "--layers", 1, "--sp-type", "vanilla", "--k", 3,
                 "--accept-policy", "accept_all", "--max-new-tokens", 8, "--prompts", "builtin:chat", *FAST,
                 "--json", out, *static)
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert meta["model"].startswith("synthetic") and meta["synthetic_layers"] == {"target": 1, "draft": 1}
    assert meta["ignore_eos"] is True and meta["synthetic_tokenizer"]
    rows = {r["label"]: r for r in data["configs"]}
    assert rows["vanilla k=3 (accept_all)"]["avg_tokens_per_iter"] == 4.0
    roof = data["rooflines"][""]
    assert roof["copy_bandwidth_bytes_per_s"] > 0 and roof["weight_bytes"] > 8192 * 64
    assert "copy bandwidth" in text


def test_synthetic_target_runs_heads_and_drafters_of_the_published_shape(tmp_path):
    # eagle3, dflash, mtp and medusa get a random head / drafter / module built for the synthetic
    # target; vanilla the --synthetic-draft decoder.
    path = small_synthetic_config(tmp_path)
    out = tmp_path / "s.json"
    bench("--synthetic", path, "--synthetic-draft", path, "--layers", 2, "--sp-type", "eagle3,dflash,mtp,medusa,vanilla",
          "--k", 3, "--accept-policy", "accept_all", "--max-new-tokens", 8, "--prompts", "builtin:chat", *FAST,
          "--json", out)
    data = json.loads(out.read_text())
    assert data["meta"]["drafts"] == {"eagle3": "random eagle3 draft", "dflash": "random dflash draft",
                                      "mtp": "random mtp draft", "medusa": "random medusa draft",
                                      "vanilla": f"synthetic {path}"}
    rows = {r["label"]: r for r in data["configs"]}
    for method in ("eagle3", "dflash", "mtp", "medusa", "vanilla"):
        row = rows[f"{method} k=3 (accept_all)"]
        assert row["avg_tokens_per_iter"] == 4.0 and row["draft_s"] > 0


def test_plot_is_a_png(pair, tmp_path):
    pytest.importorskip("matplotlib")
    target, draft = pair
    png = tmp_path / "b.png"
    bench("--model", target, "--sp-type", "deterministic", "--k", "1,2", "--max-new-tokens", 4,
          "--prompts", "builtin:summarise", *FAST, "--plot", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A kind matplotlib does not write, or the --json file: refused before anything runs.
    for args, message in ((["--plot", tmp_path / "b.xyz"], "name a .png file"),
                          (["--plot", tmp_path / "b"], "name a .png file"),
                          (["--plot", tmp_path / "same.png", "--json", tmp_path / "same.png"], "is the --json file too")):
        with pytest.raises(SpecliteError, match=message):
            bench("--model", "/no/such/model", *args)


def test_each_quants_roofline_line_names_it(pair):
    text = bench("--model", pair[0], "--sp-type", "naive", "--quant", "none,int4", "--max-new-tokens", 4,
                 "--prompts", "builtin:code", *FAST)
    assert "roofline: " in text and "roofline [int4]: " in text  # "[int4]" printed, not taken as markup


def test_plot_draws_a_line_per_method_map_quant_and_policy():
    from speclite.bench.plot import speedup_series

    rows = [{"method": "plain", "label": "plain", "k": 0, "speedup": 1.0}]
    for label_tail in ("", " map=a/f.pt", " map=b/f.pt", " [int4]", " (accept_all)"):
        rows += [{"method": "vanilla", "label": f"vanilla k={k}{label_tail}", "k": k, "speedup": 1.5}
                 for k in (2, 4, "auto")]
    series = speedup_series(rows, auto_x=5)
    assert set(series) == {"vanilla", "vanilla map=a/f.pt", "vanilla map=b/f.pt", "vanilla [int4]",
                           "vanilla (accept_all)"}
    assert all(sorted(x for x, _ in points) == [2, 4, 5] for points in series.values())


NOT_UTF8 = "NOT_UTF8"  # stands for a prompts file that is not UTF-8, written by the test
WITH_SAMPLING = "WITH_SAMPLING"  # and for one whose line sets its own sampling


@pytest.mark.parametrize("args, message", [
    (["--model", "x", "--synthetic", "qwen2.5-7b"], "exactly one of --model and --synthetic"),
    (["--synthetic-draft", "qwen2.5-0.5b", "--model", "x"], "--synthetic-draft needs --synthetic"),
    (["--k", "0"], "--k values are numbers"),
    (["--gen-num-per-cycle", "0"], "--k values are numbers"),  # the other commands' name, which errors use
    (["--sp-type", "nosuchmethod"], "unknown --sp-type 'nosuchmethod'"),
    (["--prompts", "builtin:poetry"], "unknown workload 'poetry'"),
    (["--prompts", NOT_UTF8], "is not UTF-8 text"),
    (["--prompts", WITH_SAMPLING], "'max_new_tokens' would be ignored: bench samples every prompt as its flags say"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--top-p", "0"], "top_p must be in"),
    (["--top-p", "1.5"], "top_p must be in"),
    (["--top-k", "-2"], "top_k"),
    (["--json", "/nonexistent/dir/b.json"], "cannot write --json"),
    (["--json", "/proc/b.json"], "cannot write --json"),  # root may write anywhere else: tried, not judged
    (["--plot", "/tmp"], "cannot write --plot"),
    (["--eagle-topk", "3"], "--eagle-topk is not used by --sp-type (the default sweep: "),
    (["--sp-type", "vanilla"], "needs a draft"),
    (["--sp-type", "deterministic", "--token-map", "map.pt"], "--token-map is not used by --sp-type deterministic"),
    (["--sp-type", "vanilla,suffix", "--eagle-topk", "2"], "--eagle-topk is not used by --sp-type vanilla,suffix"),
    (["--sp-type", "suffix,deterministic", "--draft-quant", "int4"],
     "--draft-quant is not used by --sp-type suffix,deterministic: no method there has a draft"),
])
def test_bad_input_is_one_clear_error(pair, args, message, tmp_path):
    target, _ = pair
    (tmp_path / "bad.jsonl").write_bytes(b'\xff\xfe{"prompt": "a"}\n')
    (tmp_path / "sampling.jsonl").write_text('{"prompt": "a", "max_new_tokens": 3}\n')
    files = {NOT_UTF8: str(tmp_path / "bad.jsonl"), WITH_SAMPLING: str(tmp_path / "sampling.jsonl")}
    args = [files.get(a, a) if isinstance(a, str) else a for a in args]
    full = (["--model", str(target)] if "--model" not in args and "--synthetic" not in args else []) + args
    with pytest.raises(SpecliteError, match=message.replace("(", r"\(")):
        bench(*FAST, *full)


def test_sampled_runs_seed_each_prompt_with_its_index(pair, tmp_path):
    """--temperature: every configuration draws each prompt's answer with seed = its index (both repeats
    and the plain row give what LLM.generate gives with that seed); '= plain' is not counted."""
    target, draft = pair
    out = tmp_path / "s.json"
    text = bench("--model", target, "--draft", draft, "--sp-type", "vanilla", "--k", 3, "--prompts", "builtin:code",
                 "--max-new-tokens", 8, "--repeats", 1, "--threads", 1, "--temperature", 0.9, "--top-k", 30,
                 "--json", out)
    data = json.loads(out.read_text())
    assert data["meta"]["sampling"] == {"temperature": 0.9, "top_p": 1.0, "top_k": 30}
    assert [row["same_as_plain"] for row in data["configs"]] == [None, None]
    assert text.split("vanilla k=3")[1].splitlines()[0].rstrip(" │").endswith(" -")
    params = SamplingParams(max_new_tokens=8, temperature=0.9, top_k=30)
    models = BenchModels.load(str(target), [str(draft)], [None], device="cpu", dtype=torch.float32)
    prompts = [p for p in BUILTIN if p.workload == "code"]
    runner = Runner(models, [BenchConfig("plain", 0, None), BenchConfig("vanilla", 3, None, draft=str(draft))],
                    prompts, params)
    records = runner.run(2)
    llm = LLM(target)
    for i, p in enumerate(prompts):
        plain = [r.token_ids for r in records if r.prompt == p.name and r.config == "plain"]
        assert plain[0] == plain[1] == llm.generate(p.prompt, replace(params, seed=i))[0].token_ids
        spec = [r.token_ids for r in records if r.prompt == p.name and r.config != "plain"]
        assert spec[0] == spec[1] and len(spec[0]) == 8


def test_plot_without_matplotlib_fails_before_loading(pair, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    with pytest.raises(SpecliteError, match="--plot needs matplotlib"):
        bench("--model", pair[0], "--plot", tmp_path / "p.png")


def test_cli_prints_one_line_not_a_traceback():
    proc = subprocess.run([sys.executable, "-m", "speclite.cli", "bench", "--k", "two", "--model", "m"],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == ["error: --k values are numbers from 1 to 64 or 'auto', got 'two'"]


def test_prompt_sets(tmp_path):
    assert set(WORKLOADS) == {"code", "json", "summarise", "edit", "chat", "repeat"}
    for w in WORKLOADS:
        assert len(load_prompts(f"builtin:{w}")) >= 3
    assert all(p.extra.get("sp_advice_prompt") and p.extra.get("sp_edit") == 1 for p in load_prompts("builtin:edit"))
    assert len(load_prompts("builtin")) == len(BUILTIN)
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "prompt": "x = 1", "workload": "code"}\n\n'
                 '{"messages": [{"role": "user", "content": "hi"}], "extra_config": {"sp_advice_prompt": "hello"}}\n')
    a, b = load_prompts(str(f))
    assert (a.name, a.workload, a.prompt) == ("a", "code", "x = 1")
    assert (b.name, b.workload, b.extra) == ("line3", "file", {"sp_advice_prompt": "hello"})
    f.write_text('{"prompt": "ok"}\n{"oops": 1}\n')
    with pytest.raises(SpecliteError, match=r"p.jsonl:2: needs a non-empty"):
        load_prompts(str(f))


def test_sweep_has_one_plain_baseline_per_quant():
    configs = build_sweep(parse_methods("naive,vanilla,ngram"), parse_ks("2,auto,2"), [None, "int4"], "accept_all")
    labels = [c.label for c in configs]
    assert labels[:6] == ["plain", "naive (accept_all)", "vanilla k=2 (accept_all)", "vanilla k=auto (accept_all)",
                          "deterministic k=2 (accept_all)", "deterministic k=auto (accept_all)"]
    assert labels[6] == "plain [int4]" and len(labels) == 12


def test_quant_labels_survive_rich_markup():
    """A label like 'vanilla k=4 [int4]' must print its [int4], not be eaten as a Rich style tag."""
    import io

    from rich.console import Console

    from speclite.bench.report import results_table

    row = {"label": "vanilla k=4 [int4]", "tokens_per_s": 1.0, "speedup": 1.0, "avg_tokens_per_iter": 1.0,
           "accept_rate": 0.0, "proposed": 0, "accepted_per_position": [], "draft_share": 0.0,
           "verify_share": 0.0, "peak_memory_bytes": 0, "same_as_plain": 1, "runs": 1}
    console = Console(file=io.StringIO(), width=200)
    console.print(results_table([row], "title", "weights+KV"))
    assert "vanilla k=4 [int4]" in console.file.getvalue()


@pytest.mark.parametrize("method, draft", [("eagle3", "tiny-code-eagle3"), ("mtp", "tiny-code-mtp"),
                                           ("dflash", "tiny-code-dflash")])
def test_draft_quant_reaches_the_heads_a_method_loads_itself(method, draft):
    """--draft-quant quantizes a head or drafter that its method loads (not only a draft model)."""
    def quantized(quant):
        models = BenchModels.load("tiny-code", [draft], [None], device="cpu", dtype=torch.float32, draft_quant=quant,
                                  draft_is_model=lambda *_: False)
        runner = Runner(models, [BenchConfig(method, 2, None, draft=draft)], BUILTIN[:1], SamplingParams(max_new_tokens=4))
        held, _ = runner.proposers[method, None].resident()
        return [type(m).__name__ for model in held for m in model.modules() if isinstance(m, QuantLinear)]

    assert quantized(None) == []
    assert quantized("int4") and set(quantized("int4")) == {"Int4Linear"}


def test_a_step_reads_every_weight_but_an_untied_embedding(pair, tmp_path):
    """The roofline's numerator: an untied input embedding gives one row a step; a tied one is the
    lm_head, read whole."""
    untied = load_model(pair[0], "cpu", torch.float32)
    embed = untied.model.embed_tokens.weight
    assert step_bytes(untied) == model_bytes(untied) - embed.nbytes + embed.shape[1] * 4
    save_model(tmp_path, "qwen2", tie_word_embeddings=True)
    tied = load_model(tmp_path, "cpu", torch.float32)
    assert step_bytes(tied) == model_bytes(tied)
