"""Per-method drafts in models.toml: each method's own recommendation for generate, the API and one
`speclite bench` run; explicit --draft still wins; bad `drafts` entries are one-line errors."""

from __future__ import annotations

import json

import re

import pytest
from click.testing import CliRunner

from speclite import LLM, SamplingParams, hub
from speclite.api import SpecConfig
from speclite.cli import cli
from speclite.errors import SpecliteError
from speclite.hub import PACKAGE_DIR

HELDOUT = PACKAGE_DIR / "assets" / "heldout_prompts.jsonl"
ASSETS = PACKAGE_DIR / "assets"
FAST = ["--threads", "1", "--repeats", "1", "--max-new-tokens", "12"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    """Four held-out prompts as a bench prompts file."""
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("".join(line + "\n" for line in HELDOUT.read_text().splitlines()[:4]))
    return path


def run(*args):
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("method, draft", [
    (None, "tiny-code-draft"), ("vanilla", "tiny-code-draft"), ("draft_model", "tiny-code-draft"),
    ("eagle3", "tiny-code-eagle3"), ("pard", "tiny-code-pard"), ("dflash", "tiny-code-dflash"),
    ("mtp", "tiny-code-mtp"), ("medusa", "tiny-code-medusa"), ("hybrid", "tiny-code-mtp"),
    ("deterministic", None), ("none", None),  # n-gram methods and plain decoding take none
])
def test_recommendation_per_method(method, draft):
    assert hub.recommended_draft("tiny-code", method=method) == draft
    assert hub.recommended_draft(str(ASSETS / "tiny-code"), method=method) == draft


@pytest.mark.parametrize("method, draft", [
    ("vanilla", "tiny-code-draft"), ("pard", "tiny-code-draft"),
    # Without an own recommendation a head method cannot run on the draft model, nor one that picks
    # its draft's kind per configuration (hybrid: without a draft, the target's MTP module).
    ("eagle3", None), ("mtp", None), ("medusa", None), ("dflash", None), ("hybrid", None),
])
def test_only_draft_model_methods_fall_back_to_the_general_draft(tmp_path, method, draft):
    models = tmp_path / "models.toml"
    models.write_text(f'[models.tc]\npath = "{ASSETS / "tiny-code"}"\ndraft = "tiny-code-draft"\n')
    assert hub.recommended_draft("tc", models, method=method) == draft


def test_api_picks_the_methods_own_draft():
    greedy = SamplingParams(max_new_tokens=16)
    prompt = json.loads(HELDOUT.read_text().splitlines()[0])["prompt"]
    plain = LLM("tiny-code").generate(prompt, greedy)[0].token_ids
    for method, draft in [("eagle3", "tiny-code-eagle3"), ("vanilla", "tiny-code-draft")]:
        llm = LLM("tiny-code", SpecConfig(method=method, k=3))
        assert llm.draft_name == draft
        assert llm.generate(prompt, greedy)[0].token_ids == plain, method


def test_generate_eagle3_without_draft(tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"id": 0, "prompt": "def add(a, b):"}) + "\n")
    text = run("generate", "-m", "tiny-code", "--sp-type", "eagle3", "--max-new-tokens", 8, "-i", inp, "-o", out)
    assert "draft tiny-code-eagle3" in text and json.loads(out.read_text())["id"] == 0


def test_bench_runs_each_method_with_its_own_draft(tmp_path, prompts):
    text = run("bench", *FAST, "-m", "tiny-code", "--sp-type", "vanilla,eagle3,pard,dflash,deterministic",
                 "--k", "2,4", "--prompts", prompts, "--json", tmp_path / "b.json")
    data = json.loads((tmp_path / "b.json").read_text())
    rows = {r["label"]: r for r in data["configs"]}
    own = {"vanilla": "tiny-code-draft", "eagle3": "tiny-code-eagle3", "pard": "tiny-code-pard",
           "dflash": "tiny-code-dflash", "deterministic": None, "plain": None}
    assert len(rows) == 1 + 5 * 2
    for row in rows.values():
        assert row["draft"] == own[row["method"]], row["label"]
        assert row["same_as_plain"] == row["runs"] == 4, row["label"]  # greedy: lossless with every draft
    assert data["meta"]["drafts"] == {m: d for m, d in own.items() if d}
    assert data["meta"]["draft"] == "tiny-code-draft, tiny-code-eagle3, tiny-code-pard, tiny-code-dflash"
    assert "each method's own draft" in text and "tiny-code-dflash" in text  # the table's draft column


def test_bench_explicit_draft_applies_to_all(tmp_path, prompts):
    text = run("bench", *FAST, "-m", "tiny-code", "--draft", "tiny-code-pard", "--sp-type", "vanilla,pard,naive",
                 "--k", 3, "--prompts", prompts, "--json", tmp_path / "b.json")
    data = json.loads((tmp_path / "b.json").read_text())
    drafts = {r["method"]: r["draft"] for r in data["configs"]}
    assert drafts == {"plain": None, "vanilla": "tiny-code-pard", "pard": "tiny-code-pard", "naive": None}
    assert all(r["same_as_plain"] == r["runs"] for r in data["configs"])
    assert data["meta"]["draft"] == "tiny-code-pard" and "+ draft tiny-code-pard" in text


def test_default_sweep_takes_a_method_whose_own_draft_is_known(tmp_path, prompts):
    """An alias with no general draft but vanilla's own: the default sweep runs vanilla with it."""
    models = tmp_path / "models.toml"
    models.write_text(f'[models.tc]\npath = "{ASSETS / "tiny-code"}"\n\n[models.tc.drafts]\nvanilla = "tiny-code-draft"\n')
    run("--models-file", models, "bench", *FAST, "-m", "tc", "--k", 2, "--prompts", prompts, "--json", tmp_path / "b.json")
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["meta"]["drafts"] == {"vanilla": "tiny-code-draft"}  # the others take no draft
    assert {"plain", "naive", "vanilla k=2", "deterministic k=2"} <= {r["label"] for r in data["configs"]}


BAD_DRAFTS = [
    ("not a table", 'drafts = "tiny-code-eagle3"', "alias 'tc': 'drafts' must be a table of method = draft"),
    ("unknown method", 'drafts = { eagle4 = "x" }', "alias 'tc': drafts.eagle4: unknown speculation method"),
    ("method without a draft", 'drafts = { deterministic = "x" }',
     "drafts.deterministic: --sp-type deterministic takes no draft"),
    ("plain decoding", 'drafts = { none = "x" }', "drafts.none: --sp-type none takes no draft"),
    ("not a string", "drafts = { eagle3 = 3 }", "drafts.eagle3 must name a draft (an alias or a directory), got 3"),
    ("empty", 'drafts = { pard = "" }', "drafts.pard must name a draft"),
]


BAD_FILES = [  # the whole file's shape (AttributeError / ValueError inside the reading before)
    ("models not a table", "models = 3", "'models' must be a table ([models]), not int"),
    ("models a list", 'models = ["a"]', "'models' must be a table ([models]), not list"),
    ("defaults not a table", 'defaults = "x"', "'defaults' must be a table ([defaults]), not str"),
    ("repo not a string", "[models.tc]\nrepo = 3", "alias 'tc': 'repo' must be a string"),
    ("default target not a string", "[defaults]\ntarget = 3", "defaults.target must be a string"),
]


@pytest.mark.parametrize("name, text, message", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_a_models_file_of_the_wrong_shape_is_one_line(tmp_path, name, text, message):
    models = tmp_path / "models.toml"
    models.write_text(text + "\n")
    with pytest.raises(SpecliteError, match=re.escape(message)):
        hub.load_registry(models)


@pytest.mark.parametrize("name, line, message", BAD_DRAFTS, ids=[c[0] for c in BAD_DRAFTS])
def test_bad_drafts_entry_is_one_line(tmp_path, name, line, message):
    models = tmp_path / "models.toml"
    models.write_text(f'[models.tc]\npath = "{ASSETS / "tiny-code"}"\n{line}\n')
    with pytest.raises(SpecliteError) as e:
        hub.load_registry(models)
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"models file {models}: ") and message in text, text
    result = CliRunner().invoke(cli, ["--models-file", str(models), "models"])
    assert isinstance(result.exception, SpecliteError) and str(result.exception) == text
