"""Bad requests, model directories and flags: each one clear line (or an error record naming the field).

The request table runs as one batch on the bundled tiny-code model (bad lines interleaved with good
ones, which must all still be generated); the model-directory and flag table calls the CLI's
`main()` in-process, so each case costs no interpreter start-up.
"""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from speclite.errors import SpecliteError

ASSETS = Path(__file__).resolve().parents[1] / "speclite" / "assets"
TINY = ASSETS / "tiny-code"
SURROGATE = "\ud800"
# A template with the three ways a chat template fails: its own raise_exception on an unknown
# role, an error inside the template (division by zero) and a sandboxed attribute access.
RAISING_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'divide' %}{{ 1 / 0 }}"
    "{%- elif m['role'] == 'sandbox' %}{{ ''.__class__.__mro__[1].__subclasses__() }}"
    "{%- elif m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m['role']) }}"
    "{%- endif %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def user(content):
    return [{"role": "user", "content": content}]


# (request line, what its error must name). Python's json writes NaN and lone surrogates as
# JSON accepts them (NaN literal, "\ud800" escape), as an adversarial client would.
BAD_REQUESTS = [
    ({"prompt": "a", "seed": 1.5}, "seed must be an integer in [0, 2**63)"),
    ({"prompt": "a", "seed": "7"}, "seed must be an integer in [0, 2**63)"),
    ({"prompt": "a", "seed": 2**70}, "seed must be an integer in [0, 2**63)"),
    ({"prompt": "a", "seed": -1}, "seed must be an integer in [0, 2**63)"),
    ({"prompt": "a", "seed": True}, "seed must be an integer in [0, 2**63)"),
    ({"prompt": "a", "top_k": 2.5}, "top_k must be an integer"),
    ({"prompt": "a", "top_k": -1}, "top_k must be an integer >= 0"),
    ({"prompt": "a", "stop": 5}, "stop must be"),
    ({"prompt": "a", "stop": [1, 2]}, "stop must be"),
    ({"prompt": "a", "stop": ""}, "stop must be a non-empty string"),
    ({"prompt": "a", "stop": ["ok", SURROGATE]}, "stop holds a lone surrogate"),
    ({"prompt": "a", "stop_token_ids": [1, "2"]}, "stop_token_ids must be a list of token ids"),
    ({"prompt": "a", "stop_token_ids": 7}, "stop_token_ids must be a list of token ids"),
    ({"prompt": "a", "max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
    ({"prompt": "a", "max_new_tokens": "10"}, "max_new_tokens must be an integer >= 1"),
    ({"prompt": "a", "max_new_tokens": 2.0}, "max_new_tokens must be an integer >= 1"),
    ({"prompt": "a", "temperature": -1}, "temperature must be >= 0"),
    ({"prompt": "a", "temperature": "hot"}, "temperature must be a finite number"),
    ({"prompt": "a", "temperature": math.nan}, "temperature must be a finite number"),
    ({"prompt": "a", "top_p": 0}, "top_p must be in (0, 1]"),
    ({"prompt": "a", "top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"prompt": "a", "top_p": math.inf}, "top_p must be a finite number"),
    ({"prompt": "a", "extra_config": {"sp_advice_prompt": 3}}, "extra_config.sp_advice_prompt must be a string"),
    ({"prompt": "a", "extra_config": {"sp_advice_prompt": "x" + SURROGATE}}, "sp_advice_prompt holds a lone surrogate"),
    ({"prompt": "a", "extra_config": {"sp_advice_ids": ["a"]}}, "extra_config.sp_advice_ids must be a list"),
    ({"prompt": "a", "extra_config": {"sp_advice_ids": 7}}, "extra_config.sp_advice_ids must be a list"),
    ({"prompt": "a", "extra_config": {"sp_advice_ids": [10**9]}}, "sp_advice_ids holds 1000000000, outside the vocabulary"),
    ({"prompt": "a", "extra_config": {"sp_advice_ids": [1], "sp_advice_prompt": "b"}}, "not both"),
    ({"prompt": "a", "extra_config": {"sp_edit": 2}}, "extra_config.sp_edit must be 0 or 1"),
    ({"prompt": "a", "extra_config": "advice"}, "extra_config must be an object"),
    ({"prompt": "a", "extra_config": {"advice": "x"}}, "unknown extra_config key 'advice'"),
    ({"prompt": ""}, "prompt must be a non-empty string"),
    ({"prompt": 42}, "needs a non-empty 'prompt'"),
    ({"prompt": "x" + SURROGATE}, "prompt holds a lone surrogate"),
    ({"id": "q" + SURROGATE, "prompt": "a"}, "id holds a lone surrogate"),
    ({"id": [1], "prompt": "a"}, "id must be a string or an integer"),
    ({"messages": []}, "needs a non-empty 'prompt'"),
    ({"messages": [{"role": "user"}]}, "messages[0].content must be a string"),
    ({"messages": ["hi"]}, "messages[0] must be an object"),
    ({"messages": [{"role": "user", "content": "a" + SURROGATE}]}, "messages[0].content holds a lone surrogate"),
    ({"prompt": "a", "messages": user("b")}, "either 'prompt' or 'messages'"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "chat template of"),
    ({"messages": [{"role": "divide", "content": "hi"}]}, "chat template of"),
    ({"messages": [{"role": "sandbox", "content": "hi"}]}, "chat template of"),
    ({"prompt": "def f(x): " * 200}, "does not fit the maximum context length of 64 tokens"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "a request must be a JSON object"),
    ('{"prompt": "a", "meta": ' + "[" * 100000 + "]" * 100000 + "}", "is not valid JSON: nested too deeply"),
    ('{"prompt": "a", "meta": ' + "7" * 5000 + "}", "is not valid JSON: Exceeds the limit (4300 digits)"),
]
GOOD = [{"prompt": "def add(a, b):"}, {"messages": user("hi")}, {"prompt": "import os", "stop": ["\n\n"], "seed": 3},
        {"prompt": "for i in", "extra_config": {"sp_advice_prompt": "range(10):", "sp_edit": 1}}]


def cli_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "SPECLITE_DEBUG"}
    return {**env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def run_cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "speclite.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=cli_env(), **kw)


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    """tiny-code with a chat template that raises (weights shared by a link)."""
    root = tmp_path_factory.mktemp("templated") / "tiny-code"
    copy_model(ASSETS / "tiny-code", root)
    (root / "chat_template.jinja").write_text(RAISING_TEMPLATE)
    return root


def copy_model(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            (dst / f.name).symlink_to(f)
        else:
            shutil.copy(f, dst / f.name)
    return dst


def test_every_bad_request_line_is_an_error_record_and_the_rest_is_generated(tmp_path, templated):
    assert len(BAD_REQUESTS) >= 40
    lines, expect = [], {}
    for i, (bad, message) in enumerate(BAD_REQUESTS):
        if isinstance(bad, dict):
            bad = json.dumps({"id": f"bad{i}", **bad} if "id" not in bad else bad)
        lines.append(bad)
        expect[len(lines)] = message
        lines.append(json.dumps({"id": f"good{i}", **GOOD[i % len(GOOD)]}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    r = run_cli("generate", "--model", templated, "-i", inp, "-o", out, "--max-new-tokens", 3, "--max-model-len", 64,
                "--sp-type", "deterministic")
    # The run goes on past each bad line; its exit status and last line say some failed.
    assert r.returncode == 1 and r.stderr.splitlines()[-1] == (
        f"error: {len(BAD_REQUESTS)} of {len(lines)} lines failed: their error records are in {out}; fix them and run "
        "the same command again (it skips the finished ones)"), r.stderr
    assert "Traceback" not in r.stderr
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(records) == len(lines)
    for number, (line, record) in enumerate(zip(lines, records), start=1):
        if number in expect:
            assert "text" not in record, line
            assert record["error"].startswith(f"line {number}: ") or record["error"].startswith(f"line {number} ")
            assert expect[number] in record["error"], (line, record["error"])
            assert len(record["error"].splitlines()) == 1 and "Traceback" not in record["error"]
        else:
            assert "error" not in record and record["token_ids"], (line, record)
    # Keyed by the id when the id is valid, by the line number when it is not.
    assert records[0]["id"] == "bad0" and "line" in records[lines.index(json.dumps(
        {"id": "q" + SURROGATE, "prompt": "a"}))]


def test_a_null_field_is_a_field_not_given():
    """null meant the default for the sampling fields, but an error for id ('must be a string') and for a
    prompt beside messages ('not both')."""
    from speclite.request import parse_request

    request = parse_request({"id": None, "prompt": None, "messages": user("hi"), "seed": None})
    assert request.id is None and request.prompt == user("hi") and request.params.seed is None


@pytest.mark.parametrize("bad, message", [b for b in BAD_REQUESTS if isinstance(b[0], dict)
                                          and "chat template" not in b[1] and "context" not in b[1]
                                          and "vocabulary" not in b[1]])
def test_the_same_validation_answers_the_api(bad, message):
    """parse_request (what batch and the server call) gives the same field-naming message."""
    from speclite.request import parse_request

    with pytest.raises(SpecliteError, match="^line 9: ") as e:
        parse_request(bad, where="line 9")
    assert message in str(e.value)


def test_llm_calls_validate_params_messages_and_advice():
    from speclite import LLM, SamplingParams

    with pytest.raises(SpecliteError, match=r"seed must be an integer in \[0, 2\*\*63\)"):
        SamplingParams(seed=1.5)
    with pytest.raises(SpecliteError, match="top_k must be an integer"):
        SamplingParams(top_k=2.5)
    llm = LLM(ASSETS / "tiny-code")
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(SpecliteError, match="messages\\[0\\].content must be a string"):
        llm.generate([{"role": "user", "content": 3}], params)
    with pytest.raises(SpecliteError, match="outside the vocabulary of"):
        llm.generate("a", params, {"sp_advice_ids": [llm.target.args.vocab_size]})
    assert llm.generate("a", params)[0].token_ids  # still usable after refusing


# What a Python caller may pass wrong: a SpecliteError naming it, never a TypeError from deep inside.
BAD_API_CALLS = [
    (lambda LLM, S: LLM(TINY, "ngram"), "speculative_config must be a dict"),
    (lambda LLM, S: LLM(TINY, {"method": 5}), "speculative method must be a string"),
    (lambda LLM, S: LLM(TINY, {"method": "ngram", "num_speculative_tokens": 2.5}), "must be an integer or 'auto'"),
    (lambda LLM, S: LLM(TINY, {"method": "ngram", "num_speculative_tokens": True}), "must be an integer or 'auto'"),
    (lambda LLM, S: LLM(TINY, {"method": "ngram", "prompt_lookup_max": 3.7}), "prompt_lookup_max must be an integer"),
    (lambda LLM, S: LLM(TINY, {"method": "draft_model", "parallel_drafting": "no"}), "must be true or false"),
    (lambda LLM, S: LLM(TINY, {"method": "suffix", "suffix_decoding_max_spec_factor": float("inf")}),
     "suffix_decoding_max_spec_factor must be a finite number"),
    (lambda LLM, S: LLM(TINY, device="mps"), "unknown device 'mps'"),
    (lambda LLM, S: LLM(TINY, dtype=torch.int8), "unsupported dtype torch.int8"),
    (lambda LLM, S: LLM(TINY, max_model_len="64"), "max_model_len must be an integer"),
    (lambda LLM, S: LLM(TINY).generate("x", {"max_new_tokens": 4}), "params must be a SamplingParams"),
    (lambda LLM, S: LLM(TINY).generate(5), "prompts must be a string"),
    # Megabytes of text are refused before the tokenizer reads them (seconds of the engine's time).
    (lambda LLM, S: LLM(TINY).generate("x" * 10**7), "prompt of 10000000 characters (at least "),
    (lambda LLM, S: LLM(TINY, {"method": "ngram"}).set_speculation("no"), "takes True or False"),
    (lambda LLM, S: LLM(TINY, {"method": "ngram"}).set_k(2.5), "must be an integer or 'auto'"),
    (lambda LLM, S: LLM(TINY, {"method": "ngram"}).set_k("\u00b2"), "must be a number or 'auto', got '\u00b2'"),
    (lambda LLM, S: LLM(TINY, {"method": "ngram", "num_speculative_tokens": 99}),
     "num_speculative_tokens must be between 0 and 64"),
    (lambda LLM, S: LLM(TINY, {"method": "vanilla", "model": ""}), "speculative draft (model) is empty"),
    (lambda LLM, S: LLM(TINY, static="yes"), "static takes True or False"),
    (lambda LLM, S: LLM(""), "the model name is empty"),
    (lambda LLM, S: LLM("tiny-code", models_file=5), "models_file must be a path, got 5"),
    (lambda LLM, S: LLM("tiny-code", models_file="/tmp"), "cannot read models file /tmp: Is a directory"),
    (lambda LLM, S: LLM(TINY).stream("x", S(max_new_tokens=2), result={}), "result must be a list"),
    (lambda LLM, S: LLM(TINY).stream(["a", "b"]), "stream takes one prompt"),
    (lambda LLM, S: LLM(TINY).generate([1, 2]), "prompts[0] must be a string or chat messages"),
]


def test_an_error_names_the_option_as_the_caller_gave_it(monkeypatch, capsys, tmp_path):
    """The CLI's errors name its flags, the Python API's (before and after a CLI command ran in the same
    process) its keys; one check serves both."""
    from speclite import LLM, SamplingParams

    def api_error():
        with pytest.raises(SpecliteError) as e:
            LLM(TINY, {"method": "ngram", "num_speculative_tokens": 99, "prompt_lookup_max": 2})
        return str(e.value)

    assert api_error() == "num_speculative_tokens must be between 0 and 64, got 99"
    (tmp_path / "in.jsonl").write_text('{"prompt": "a"}\n')
    assert run_main(monkeypatch, capsys, ["generate", "-m", TINY, "--sp-type", "deterministic", "--gen-num-per-cycle", 99,
                                          "-i", tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl"]) == \
        (1, "error: --gen-num-per-cycle must be between 0 and 64, got 99\n")
    assert api_error() == "num_speculative_tokens must be between 0 and 64, got 99"
    with pytest.raises(SpecliteError, match=re.escape("need 1 <= prompt_lookup_min (3) <= prompt_lookup_max (2)")):
        LLM(TINY, {"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2})
    # Raised while a stream is read, too.
    stream = LLM(TINY, {"method": "ngram", "verify": "greedy"}).stream("x", SamplingParams(temperature=0.8))
    with pytest.raises(SpecliteError, match="^verify greedy needs temperature 0"):
        next(stream)


def test_a_bad_prompt_in_a_list_is_refused_before_any_is_answered(monkeypatch):
    """generate(["ok", ""]) answered the first, then raised for the second: the answer was lost."""
    from speclite import LLM

    llm = LLM(TINY)
    answered = []
    monkeypatch.setattr(llm.engine, "generate", lambda *args: answered.append(args))
    with pytest.raises(SpecliteError, match="prompt must be a non-empty string"):
        llm.generate(["def f():", ""])
    assert answered == []


def test_speculative_options_none_are_no_options():
    from speclite import LLM, SamplingParams
    from speclite.api import SpecConfig

    llm = LLM(TINY, SpecConfig(method="ngram", options=None))
    assert llm.generate("import os\n", SamplingParams(max_new_tokens=4))[0].token_ids


@pytest.mark.parametrize("call, message", BAD_API_CALLS, ids=[m for _, m in BAD_API_CALLS])
def test_bad_python_api_calls_are_one_clear_error(call, message):
    from speclite import LLM, SamplingParams

    with pytest.raises(SpecliteError, match=re.escape(message)):
        call(LLM, SamplingParams)


# ----------------------------------------------------------------------------------------------
# Model directories and flags: exit code, exactly one stderr line, no traceback.

def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps(change(data)))


def cfg(**fields):
    return lambda d: {**d, **fields}


def without(name):
    return lambda d: {k: v for k, v in d.items() if k != name}


def truncate_weights(model: Path) -> None:
    target = (model / "model.safetensors").resolve()
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").write_bytes(target.read_bytes()[: 200_000])


def make_dir_case(root: Path, name: str, edit) -> Path:
    model = copy_model(ASSETS / "tiny-code", root / name)
    if callable(edit):
        edit(model)
    return model


def index_with_list(model: Path) -> None:
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model.safetensors"]}))


def config_dir(model: Path) -> None:
    (model / "config.json").unlink()
    (model / "config.json").mkdir()


def no_tokenizer_files(model: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()


# (name, how to break a copy of tiny-code, extra flags, exit code, what the one line says)
BAD_DIRS = [
    ("config-list", lambda m: (m / "config.json").write_text("[1, 2]"), [], "must hold a JSON object, not a list"),
    ("config-dir", config_dir, [], "is a directory, not a JSON file"),
    ("config-not-json", lambda m: (m / "config.json").write_text("{"), [], "is not valid JSON"),
    ("no-heads", lambda m: edit_json(m / "config.json", without("num_attention_heads")), [], "lacks 'num_attention_heads'"),
    ("zero-heads", lambda m: edit_json(m / "config.json", cfg(num_attention_heads=0)), [],
     "'num_attention_heads' must be a positive integer, got 0"),
    ("hidden-string", lambda m: edit_json(m / "config.json", cfg(hidden_size="256")), [],
     "'hidden_size' must be a positive integer, got '256'"),
    ("layers-float", lambda m: edit_json(m / "config.json", cfg(num_hidden_layers=1.5)), [],
     "'num_hidden_layers' must be a positive integer"),
    ("kv-heads", lambda m: edit_json(m / "config.json", cfg(num_key_value_heads=3)), [],
     "must be a multiple of num_key_value_heads"),
    ("eps-negative", lambda m: edit_json(m / "config.json", cfg(rms_norm_eps=-1)), [], "'rms_norm_eps' must be a positive"),
    ("rope-no-factor", lambda m: edit_json(m / "config.json", cfg(rope_parameters={"rope_type": "linear", "rope_theta": 1e4})),
     [], "RoPE scaling 'linear' needs 'factor'"),
    ("rope-llama3", lambda m: edit_json(m / "config.json", cfg(rope_parameters={"rope_type": "llama3", "factor": 8.0})),
     [], "RoPE scaling 'llama3' needs 'low_freq_factor'"),
    ("rope-list", lambda m: edit_json(m / "config.json", cfg(rope_scaling=[1])), [], "'rope_scaling' must be an object"),
    ("architecture", lambda m: edit_json(m / "config.json", cfg(architectures=["GPT2LMHeadModel"])), [],
     "unsupported architecture 'GPT2LMHeadModel'"),
    # Another architecture's config (GPT-2's n_embd, n_layer) is named as such, not as one lacking our sizes.
    ("gpt2-config", lambda m: edit_json(m / "config.json", lambda d: {"architectures": ["GPT2LMHeadModel"],
                                                                      "n_embd": 256, "n_layer": 6, "vocab_size": 4096}),
     [], "unsupported architecture 'GPT2LMHeadModel'"),
    ("gen-config", lambda m: (m / "generation_config.json").write_text("eos: 2"), [], "generation_config.json is not valid JSON"),
    ("gen-eos", lambda m: edit_json(m / "generation_config.json", cfg(eos_token_id="2")), [], "'eos_token_id' must be"),
    ("index-list", index_with_list, [], "'weight_map' must be an object"),
    ("tokenizer-structure", lambda m: edit_json(m / "tokenizer.json", cfg(model=[1, 2])), [], "is not a tokenizers file"),
    ("tokenizer-not-json", lambda m: (m / "tokenizer.json").write_text("{"), [], "tokenizer.json is not valid JSON"),
    ("no-tokenizer", no_tokenizer_files, [], "has no tokenizer files"),
    ("only-tokenizer-config", lambda m: (m / "tokenizer.json").unlink(), [], "has no tokenizer files"),
    ("vocab-smaller", lambda m: edit_json(m / "config.json", cfg(vocab_size=1000)), [],
     "its tokenizer has 4096 tokens but the embedding table only 1000 rows"),
    ("embedding-shape", lambda m: edit_json(m / "config.json", cfg(vocab_size=5000)), [],
     "'model.embed_tokens.weight' has shape (4096, 256), but config.json"),
    ("truncated-weights", truncate_weights, [], "is corrupt or truncated"),
    ("kv-too-big", lambda m: edit_json(m / "config.json", cfg(max_position_embeddings=2**40)),
     ["--max-model-len", 2**36], "use a smaller --max-model-len or a quant scheme"),
    ("context", None, ["--max-model-len", 10**6], "--max-model-len 1000000 exceeds the model's context of 2048"),
    ("max-model-len", None, ["--max-model-len", 1], "--max-model-len must be at least 2 tokens"),
]


def int4_draft(root: Path) -> Path:
    from speclite.quant import quantize_to_dir

    quantize_to_dir(ASSETS / "tiny-code-draft", root / "int4-draft", "int4", group_size=32, evaluate=False)
    return root / "int4-draft"


def draft_too_small(root: Path) -> Path:
    draft = copy_model(ASSETS / "tiny-code-draft", root / "small-draft")
    edit_json(draft / "config.json", cfg(vocab_size=1024))
    return draft


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cases")
    inp = root / "in.jsonl"
    inp.write_text(json.dumps({"id": 1, "prompt": "def"}) + "\n")
    return root, inp


def run_main(monkeypatch, capsys, args):
    from speclite.cli import main

    monkeypatch.delenv("SPECLITE_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["speclite", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        main()
    return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize("name, edit, flags, message", BAD_DIRS, ids=[c[0] for c in BAD_DIRS])
def test_bad_model_directory_is_one_line(monkeypatch, capsys, files, name, edit, flags, message):
    root, inp = files
    model = make_dir_case(root, name, edit) if edit else ASSETS / "tiny-code"
    code, err = run_main(monkeypatch, capsys, ["generate", "--model", model, "-i", inp, "-o", root / f"{name}.jsonl",
                                               *flags])
    assert code == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and message in err, err


# Not the missing tokenizers: round-to-nearest without the evaluation reads no text, so it needs none.
QUANTIZE_DIRS = [c for c in BAD_DIRS if c[1] is not None and not c[2] and c[0] not in ("no-tokenizer", "only-tokenizer-config")]


@pytest.mark.parametrize("name, edit, flags, message", QUANTIZE_DIRS, ids=[c[0] for c in QUANTIZE_DIRS])
def test_quantize_refuses_a_bad_model_directory_in_one_line(monkeypatch, capsys, files, name, edit, flags, message):
    root, _ = files
    model = make_dir_case(root, f"quantize-{name}", edit)
    out = root / f"{name}-int4"
    code, err = run_main(monkeypatch, capsys, ["quantize", model, "--scheme", "int4", "-o", out, "--no-eval"])
    assert code == 1 and not out.exists()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and message in err, err


def flag_cases(root, inp):
    base = ["generate", "--model", ASSETS / "tiny-code", "-i", inp, "-o", root / "flags.jsonl"]
    return [
        (base + ["--sp-type", "vanilla", "--draft", draft_too_small(root)], 1, "embedding table only 1024 rows"),
        (base + ["--seed", "-1"], 1, "seed must be an integer in [0, 2**63)"),
        (base + ["--top-p", "2"], 1, "top_p must be in (0, 1]"),
        (base + ["--max-new-tokens", "abc"], 2, "'abc' is not a valid integer"),
        (base + ["--nope"], 2, "No such option"),
        (base + ["--sp-type", "vanilla", "--gen-num-per-cycle", "99"], 1, "between 0 and 64"),
        (base + ["--draft-quant", "int4"], 1, "--draft-quant is not used by --sp-type none"),
        (base + ["--sp-type", "vanilla", "--draft", int4_draft(root), "--draft-quant", "int4"], 1,
         f"--draft-quant int4: {root / 'int4-draft'} is quantized already (int4 gptq); leave --draft-quant out"),
        (base + ["--gen-num-per-cycle", "3"], 1, "--gen-num-per-cycle is not used by --sp-type none"),
        (base + ["--sp-type", "deterministic", "--gen-num-per-cycle", "0"], 1,
         "--gen-num-per-cycle 0 has --sp-type deterministic draft nothing: use --sp-type naive"),
        (base + ["--verify", "rejection"], 1, "--verify is not used by --sp-type none"),
        (base + ["--accept-policy", "accept_all"], 1, "--accept-policy is not used by --sp-type none"),
        # Another method's flag would be ignored: named instead.
        (base + ["--sp-type", "suffix", "--token-map", "freq_1024.pt"], 1, "--token-map is not used by --sp-type suffix"),
        (base + ["--sp-type", "vanilla", "--medusa-topk", "3"], 1, "--medusa-topk is not used by --sp-type vanilla"),
        (base + ["--sp-type", "medusa", "--draft", "tiny-code-medusa", "--draft-quant", "int4/int4"], 1,
         "Medusa heads take one scheme, their lm_heads' (--draft-quant int4)"),
        # An MTP module reading the target's head drafts through a copy quantized to HEAD: not from a
        # head quantized already.
        (base + ["--quant", "int4/int4", "--sp-type", "mtp", "--draft", "tiny-code-mtp", "--draft-quant", "int4/int4"],
         1, "a quantized copy of the target's head, which is quantized already"),
        # quantize: a flag the scheme and method would ignore
        (["quantize", ASSETS / "tiny-code", "--scheme", "w8a8", "--group-size", "64", "-o", root / "q"], 1,
         "--group-size is not used here: --scheme w8a8 has no groups"),
        (["quantize", ASSETS / "tiny-code", "--scheme", "int4", "--alpha", "0.3", "-o", root / "q"], 1,
         "--alpha is not used here"),
        (["quantize", ASSETS / "tiny-code", "--scheme", "int4", "--no-eval", "--calib-samples", "8", "-o", root / "q"], 1,
         "--calib-samples is not used here: rtn reads no data and --no-eval skips the evaluation"),
        (["quantize", ASSETS / "tiny-code", "--scheme", "int4", "--group-size", "24", "-o", root / "q"], 1,
         "--group-size must be one of 16, 32, 64, 128, 256, 512, 1024 (the group sizes transformers' GPTQ loader takes)"),
        (["quantize", ASSETS / "tiny-code", "--scheme", "int4", "--method", "gptq", "--seq-len", "10", "-o", root / "q"],
         1, "--method gptq needs --seq-len above 10: GPTQModel drops shorter calibration windows"),
        (["generate", "--model", ASSETS / "tiny-code", "-i", inp, "-o", root], 1, "is not a regular file"),
        (["generate", "--model", ASSETS / "tiny-code", "-i", inp, "-o", "/dev/full"], 1, "is not a regular file"),
        (["generate", "--model", ASSETS / "tiny-code", "-i", inp, "-o", inp], 1, "is the input file"),
    ]


def test_bad_flags_and_drafts_are_one_line(monkeypatch, capsys, files):
    root, inp = files
    for args, want_code, message in flag_cases(root, inp):
        code, err = run_main(monkeypatch, capsys, args)
        assert code == want_code, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (args, err)
        assert message in err, (args, err)


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(monkeypatch, capsys, files):
    root, inp = files
    import speclite.batch

    def broken(*a, **k):
        raise ValueError("something nobody planned for")

    monkeypatch.setattr(speclite.batch, "parse_jobs", broken)
    args = ["generate", "--model", ASSETS / "tiny-code", "-i", inp, "-o", root / "x.jsonl"]
    code, err = run_main(monkeypatch, capsys, args)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "internal error (ValueError: something nobody planned for)" in err and "--debug" in err
    try:
        code, err = run_main(monkeypatch, capsys, ["--debug", *args])
    finally:
        os.environ.pop("SPECLITE_DEBUG", None)  # --debug sets it for main(); monkeypatch did not
    assert code == 1 and "Traceback" in err and "raise ValueError" in err
    assert err.strip().splitlines()[-1].startswith("error: internal error")


def test_ctrl_c_while_the_command_starts_is_one_line():
    """The installed command's entry point (speclite.launch) is running before torch loads: a Ctrl-C
    in those first second or two is one line and exit 130, as later, not an import's traceback."""
    import time

    for _ in range(3):  # (a library's import may swallow the KeyboardInterrupt: the command then just runs)
        proc = subprocess.Popen([sys.executable, "-m", "speclite.launch", "models"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)  # the imports take longer than this
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            break
    assert proc.returncode == 130 and "Traceback" not in err and err.strip() == "interrupted", err


def test_ctrl_c_is_exit_130_even_when_torch_turns_it_into_another_error(monkeypatch, capsys, files):
    """A KeyboardInterrupt raised while torch's C++ runs Python code can surface as another exception
    (CI saw quantize's Ctrl-C end as "ValueError: could not determine the shape of object type
    'torch.storage.UntypedStorage'"); the signal, not the exception, says it was Ctrl-C."""
    root, inp = files
    import speclite.batch
    from speclite.cli import INTERRUPTED

    def interrupted_inside_torch(*a, **k):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            raise ValueError("could not determine the shape of object type 'torch.storage.UntypedStorage'") from None

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(speclite.batch, "parse_jobs", interrupted_inside_torch)
    code, err = run_main(monkeypatch, capsys, ["generate", "--model", ASSETS / "tiny-code", "-i", inp,
                                               "-o", root / "ctrl-c.jsonl"])
    resume = "finished results are saved; run the same command again to resume"
    assert code == 130 and err.strip() == f"{INTERRUPTED}: {resume}", err
    assert signal.getsignal(signal.SIGINT) is before  # main() leaves its caller's handler
