"""DFlash's k: without --gen-num-per-cycle (vLLM's num_speculative_tokens) a run drafts the
drafter's block size - 1 per iteration, a smaller value is used as is, a larger one is an error (it
was shown but never run), and `auto` adapts up to it; through LLM, the CLI and the bench, greedy output stays plain decoding's.
The default comes from the built proposer (Method.default_k), a seam any method may use."""

import json
import shlex

import pytest
from click.testing import CliRunner

from conftest import save_model
from dflash_drafts import save_drafter
from speclite import LLM, SamplingParams, SpecConfig
from speclite.cli import cli
from speclite.speculate import Method, Proposal, Proposer, register
from speclite.speculate.registry import unregister

BLOCK = 7  # the drafter's block: 6 drafts per iteration by default (not the general default, 4)
GREEDY = SamplingParams(max_new_tokens=12)  # as `speclite generate` runs it
PROMPTS = ["def add(a, b):", "the quick brown", "import os"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target dir, drafter dir): a 4-layer Qwen3 target and a random 2-layer drafter of block size BLOCK."""
    root = tmp_path_factory.mktemp("dflash-k")
    save_model(root / "target", "qwen3", seed=5, hidden=64, layers=4)
    vocab = json.loads((root / "target" / "config.json").read_text())["vocab_size"]
    save_drafter(root / "draft", 64, vocab, (0, 2, 3), vocab - 1, seed=3, block_size=BLOCK)
    return root / "target", root / "draft"


@pytest.fixture(scope="module")
def plain(pair):
    llm = LLM(pair[0])
    return [llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS]


def depth(llm: LLM) -> tuple[int, list[list[int]]]:
    """(the deepest draft of any iteration over PROMPTS, their outputs)."""
    outs = [llm.generate(p, GREEDY)[0] for p in PROMPTS]
    return max(len(o.stats.proposed_at) for o in outs), [o.token_ids for o in outs]


API_CASES = [  # (name, speculative_config beyond method and model, k after loading, deepest draft)
    ("default", {}, BLOCK - 1, BLOCK - 1),
    ("fewer", {"num_speculative_tokens": 2}, 2, 2),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_llm_k_from_the_drafter_unless_given(pair, plain, case):
    _, extra, k, deepest = case
    llm = LLM(pair[0], {"method": "dflash", "model": str(pair[1]), **extra})
    assert llm.spec_config.k == k and llm.k_label == str(k)
    got, outs = depth(llm)
    assert got == deepest and outs == plain


def test_more_drafts_than_the_block_holds_is_an_error(pair):
    from speclite.errors import SpecliteError

    with pytest.raises(SpecliteError, match=f"num_speculative_tokens 9: method dflash drafts at most {BLOCK - 1} "):
        LLM(pair[0], {"method": "dflash", "model": str(pair[1]), "num_speculative_tokens": 9})
    llm = LLM(pair[0], {"method": "dflash", "model": str(pair[1])})
    with pytest.raises(SpecliteError, match="drafts at most"):
        llm.set_k(BLOCK)  # chat's /k
    assert llm.k_label == str(BLOCK - 1)


def test_auto_and_runtime_k(pair, plain):
    """`auto` adapts up to the block (SpecConfig, not only vLLM's dict); chat's /k (set_k) keeps both rules."""
    llm = LLM(pair[0], SpecConfig("dflash", k="auto", draft=str(pair[1])))
    assert llm.engine.spec.length.k_max == BLOCK - 1
    got, outs = depth(llm)
    assert got <= BLOCK - 1 and outs == plain
    llm.set_k(2)
    assert depth(llm) == (2, plain)
    llm.set_k("auto")
    assert llm.engine.spec.length.k_max == BLOCK - 1


CLI_CASES = [([], BLOCK - 1), (["--gen-num-per-cycle", "2"], 2)]


@pytest.mark.parametrize("flags, deepest", CLI_CASES, ids=["default", "fewer"])
def test_cli_generate(pair, plain, tmp_path, flags, deepest):
    """`speclite generate --sp-type dflash --draft D` (chat and serve build their LLM the same way)."""
    target, draft = pair
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    r = CliRunner().invoke(cli, ["generate", "--model", str(target), "-i", str(inp), "-o", str(out), "--max-new-tokens",
                                 str(GREEDY.max_new_tokens), "--sp-type", "dflash", "--draft", str(draft), *flags], obj={})
    assert r.exit_code == 0, r.output
    records = {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines())}
    assert [records[i]["token_ids"] for i in range(len(PROMPTS))] == plain
    assert max(len(rec["aux_info"]["accepted_per_position"]) for rec in records.values()) == deepest


@pytest.mark.parametrize("ks, rows", [([], {f"dflash k={BLOCK - 1}": BLOCK - 1}),
                                      (["--k", "2,auto"], {"dflash k=2": 2, "dflash k=auto": BLOCK - 1})],
                         ids=["default", "given"])
def test_bench_rows(pair, tmp_path, ks, rows):
    """`speclite bench --sp-type dflash` without --k runs one row at the drafter's k, labelled with it."""
    target, draft = pair
    path = tmp_path / "bench.json"
    r = CliRunner().invoke(cli, ["bench", "--model", str(target), "--draft", str(draft), "--sp-type", "dflash", *ks,
                                 "--prompts", "builtin:code", "--max-new-tokens", "8", "--threads", "1",
                                 "--repeats", "1", "--json", str(path)])
    assert r.exit_code == 0, r.output
    data = json.loads(path.read_text())
    got = {c["label"]: c for c in data["configs"] if c["method"] == "dflash"}
    assert set(got) == set(rows) and all(c["same_as_plain"] == c["runs"] for c in got.values())
    for label, deepest in rows.items():
        drafted = max(len(run["proposed_at"]) for run in data["runs"] if run["config"] == label)
        assert drafted <= deepest if label.endswith("auto") else (drafted, got[label]["k"]) == (deepest, deepest)


class Depth(Proposer):
    """Throwaway method with a trained depth of its own: proposes the last token, at most k times."""

    name = "depth"

    def __init__(self, depth: int):
        self.depth = depth

    def begin(self, prompt_ids, ctx):
        self.last = prompt_ids[-1]

    def propose(self, k):
        return Proposal([self.last] * k)

    def observe(self, tokens, states=None):
        self.last = tokens[-1]


@pytest.fixture
def depth_method():
    register(Method("depth", lambda ctx: Depth(3), "test method",
                    default_k=lambda proposer: proposer.depth))
    yield
    unregister("depth")


def test_any_method_may_supply_its_default_k(pair, depth_method):
    """The seam is general: a method's built proposer names its k; the others keep 4."""
    llm = LLM(pair[0], SpecConfig("depth"))
    assert llm.spec_config.k == 3 and LLM(pair[0], SpecConfig("depth", k="auto")).engine.spec.length.k_max == 3
    assert LLM(pair[0], SpecConfig("depth", k=1)).spec_config.k == 1
    assert LLM(pair[0], SpecConfig("deterministic")).spec_config.k == 4
    r = CliRunner().invoke(cli, ["serve", "--model", "tiny-code", "--sp-type", "deterministic",
                                 "--print-engine-command", "vllm"], obj={})
    argv = shlex.split(r.output)
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config["num_speculative_tokens"] == 4  # `speclite serve --print-engine-command` without the flag
