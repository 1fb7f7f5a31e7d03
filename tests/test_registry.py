"""The method registry: one place names every method; SpecConfig, vLLM configs and the CLI read it."""

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from speclite import LLM, SamplingParams, SpecConfig
from speclite.cli_options import spec_options
from speclite.errors import SpecliteError
from speclite.speculate import Method, Option, Proposal, Proposer, register
from speclite.speculate.registry import METHODS, method_names, unregister

GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)


class RepeatLast(Proposer):
    """Throwaway method: proposes the last token `times` times (often wrong, sometimes right)."""

    name = "repeat_last"

    def __init__(self, times: int, vocab: int):
        self.times, self.vocab = times, vocab

    def begin(self, prompt_ids, ctx):
        self.last = prompt_ids[-1]

    def propose(self, k):
        return Proposal([self.last] * min(k, self.times))

    def observe(self, tokens, states=None):
        self.last = tokens[-1]


@pytest.fixture
def repeat_last():
    built = []

    def build(ctx):
        built.append(ctx)
        return RepeatLast(ctx.options["times"], ctx.target_vocab)

    register(Method("repeat_last", build, "test method", options=(
        Option("times", int, 2, "How many copies.", vllm="repeat_times"),), needs_target=True,
        aliases=("repeat",)))
    yield built
    unregister("repeat_last")


def test_registered_method_is_reachable_through_specconfig_and_llm(pair, repeat_last):
    assert "repeat_last" in method_names()
    plain = LLM(pair[0]).generate("def add(a, b):", GREEDY)[0].token_ids
    llm = LLM(pair[0], SpecConfig(method="repeat", k=3, options={"times": "3"}))
    assert llm.spec_config.method == "repeat_last" and llm.spec_config.options == {"times": 3}
    out = llm.generate("def add(a, b):", GREEDY)[0]
    assert out.token_ids == plain  # lossless whatever the method proposes
    assert out.stats.proposed > 0
    ctx = repeat_last[-1]
    assert ctx.target is llm.target and ctx.draft is None and ctx.options == {"times": 3}
    # vLLM key from the option's declaration; defaults filled in.
    cfg = SpecConfig.from_vllm({"method": "repeat_last", "repeat_times": 1, "num_speculative_tokens": 2})
    assert cfg.options == {"times": 1} and cfg.validated().options == {"times": 1}
    assert SpecConfig(method="repeat_last").validated().options == {"times": 2}


def test_registered_method_gets_cli_flags(repeat_last):
    seen = {}

    @click.command()
    @spec_options
    def cmd(**flags):
        seen.update(flags)

    r = CliRunner().invoke(cmd, ["--sp-type", "repeat_last", "--times", "5"])
    assert r.exit_code == 0, r.output
    assert seen["sp_type"] == "repeat_last" and seen["opt_times"] == 5
    r = CliRunner().invoke(cmd, ["--help"])
    assert "repeat_last" in r.output and "--times" in r.output


def test_option_errors_are_one_line(repeat_last):
    with pytest.raises(SpecliteError, match="--times must be an integer"):
        SpecConfig(method="repeat_last", options={"times": "many"}).validated()
    with pytest.raises(SpecliteError, match="takes no option min_match"):
        SpecConfig(method="repeat_last", options={"min_match": 2}).validated()
    with pytest.raises(SpecliteError, match="unknown speculative_config keys: bogus"):
        SpecConfig.from_vllm({"method": "repeat_last", "bogus": 1})
    with pytest.raises(SpecliteError, match="unknown speculation method 'nope'"):
        SpecConfig(method="nope").validated()


def test_names_cannot_be_taken_twice():
    with pytest.raises(ValueError, match="already registered"):
        register(Method("ngram", lambda ctx: None, "clash"))
    assert "ngram" not in METHODS


def test_builtin_options_come_from_the_registry():
    cfg = SpecConfig.from_vllm({"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}).validated()
    assert cfg.method == "deterministic" and cfg.options == {"min_match": 2, "max_match": 4}
    with pytest.raises(SpecliteError, match="--sp-min-token-match"):
        SpecConfig(method="deterministic", options={"min_match": 3, "max_match": 2}).validated()


def test_cli_rejects_a_draft_for_a_method_without_one(pair, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": 0, "prompt": "x"}) + "\n")
    r = subprocess.run([sys.executable, "-m", "speclite.cli", "generate", "--model", str(pair[0]), "-i", str(inp),
                        "-o", str(tmp_path / "out.jsonl"), "--sp-type", "deterministic", "--draft", str(pair[1])],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--draft is not used by --sp-type deterministic" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("config, message", [
    (SpecConfig("deterministic", draft="tiny-code-draft"), "--draft is not used by --sp-type deterministic"),
    (SpecConfig("suffix", draft_quant="int4"), "--draft-quant is not used by --sp-type suffix"),
    (SpecConfig(draft_quant="w8a8"), "--draft-quant is not used by --sp-type none"),
    (SpecConfig.from_vllm({"method": "ngram", "quantization": "int4"}), "--draft-quant is not used by --sp-type deterministic"),
])
def test_a_draft_or_its_quantization_for_a_method_without_a_draft_is_an_error(config, message):
    # The API and the server as the CLI: a draft that would not be used is refused, not ignored.
    with pytest.raises(SpecliteError, match=message):
        config.validated()


def test_a_method_may_load_its_own_draft(pair):
    """draft_is_model=False: the builder gets --draft's directory (a head loads itself), not a model."""
    seen = []

    def build(ctx):
        seen.append(ctx)
        return RepeatLast(1, ctx.target_vocab)

    register(Method("own_head", build, "test method", needs_draft=True, draft_is_model=False))
    try:
        with pytest.raises(SpecliteError, match="method own_head needs model$"):
            LLM(pair[0], SpecConfig(method="own_head"))
        LLM(pair[0], SpecConfig(method="own_head", draft=str(pair[1]), draft_quant="int4"))
    finally:
        unregister("own_head")
    assert seen[0].draft is None and seen[0].draft_dir == pair[1] and seen[0].draft_quant == "int4"
