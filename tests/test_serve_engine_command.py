"""`speclite serve --print-engine-command`: the printed vLLM / SGLang commands use only documented keys."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from speclite.cli import cli
from speclite.errors import SpecliteError

# vLLM SpeculativeConfig fields and methods (docs.vllm.ai, vllm.config.speculative; features/speculative_decoding).
VLLM_SPEC_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "quantization"}
VLLM_METHODS = {"ngram", "eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "mtp", "suffix"}
VLLM_FLAGS = {"--host", "--port", "--api-key", "--served-model-name", "--dtype", "--max-model-len", "--quantization",
              "--speculative-config"}
# SGLang server arguments (docs.sglang.io advanced_features/speculative_decoding, server_arguments).
SGLANG_FLAGS = {"--model-path", "--host", "--port", "--api-key", "--served-model-name", "--dtype", "--context-length",
                "--quantization", "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
                "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-ngram-min-match-window-size",
                "--speculative-ngram-max-match-window-size"}
SGLANG_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"}


def run(*args):
    return CliRunner().invoke(cli, ["serve", "--model", "tiny-code", *args], obj={})


def flags(argv: list[str]) -> dict[str, str]:
    """Each --flag with the value after it."""
    return {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--")}


@pytest.mark.parametrize("sp_type", ["vanilla", "deterministic"])
def test_vllm_command_uses_documented_keys(sp_type):
    r = run("--sp-type", sp_type, "--gen-num-per-cycle", "3", "--max-model-len", "1024", "--dtype", "bfloat16",
            "--quant", "fp8-block", "--api-key", "k", "--print-engine-command", "vllm")
    assert r.exit_code == 0, r.output
    argv = shlex.split(r.output)
    assert argv[:2] == ["vllm", "serve"] and argv[2].endswith("tiny-code")
    f = flags(argv)
    assert set(f) <= VLLM_FLAGS
    assert f["--max-model-len"] == "1024" and f["--dtype"] == "bfloat16" and f["--quantization"] == "fp8"
    config = json.loads(f["--speculative-config"])
    assert set(config) <= VLLM_SPEC_KEYS and config["method"] in VLLM_METHODS
    assert config["num_speculative_tokens"] == 3
    if sp_type == "vanilla":
        assert config["method"] == "draft_model" and config["model"].endswith("tiny-code-draft")
    else:
        assert config["method"] == "ngram" and (config["prompt_lookup_min"], config["prompt_lookup_max"]) == (1, 3)


@pytest.mark.parametrize("sp_type", ["vanilla", "deterministic"])
def test_sglang_command_uses_documented_flags(sp_type):
    r = run("--sp-type", sp_type, "--gen-num-per-cycle", "5", "--sp-max-token-match", "4", "--max-model-len", "512",
            "--port", "30000", "--print-engine-command", "sglang")
    assert r.exit_code == 0, r.output
    argv = shlex.split(r.output)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    f = flags(argv)
    assert set(f) <= SGLANG_FLAGS and f["--speculative-algorithm"] in SGLANG_ALGORITHMS
    assert f["--context-length"] == "512" and f["--port"] == "30000" and f["--served-model-name"] == "tiny-code"
    if sp_type == "vanilla":
        assert f["--speculative-algorithm"] == "STANDALONE" and f["--speculative-draft-model-path"].endswith("tiny-code-draft")
        assert (f["--speculative-num-steps"], f["--speculative-eagle-topk"], f["--speculative-num-draft-tokens"]) == ("5", "1", "6")
    else:
        assert f["--speculative-algorithm"] == "NGRAM" and f["--speculative-ngram-max-match-window-size"] == "4"


def test_plain_decoding_has_no_speculation_flags():
    for engine in ("vllm", "sglang"):
        r = run("--print-engine-command", engine)
        assert r.exit_code == 0 and "speculative" not in r.output


@pytest.mark.parametrize("args", [["--quant", "int4"], ["--sp-type", "vanilla", "--draft-quant", "int4"],
                                  ["--sp-type", "vanilla", "--gen-num-per-cycle", "auto"],
                                  ["--sp-type", "vanilla", "--verify", "topp"],
                                  ["--sp-type", "vanilla", "--verify", "typical"]])
def test_no_equivalent_is_one_clear_error(args):
    r = run(*args, "--print-engine-command", "vllm")
    assert isinstance(r.exception, SpecliteError) and "equivalent" in str(r.exception)


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "fastapi", None)  # import fastapi -> ImportError
    r = run()
    assert isinstance(r.exception, SpecliteError) and "pip install 'speclite[serve]'" in str(r.exception)
