"""bitsandbytes: checkpoints written by transformers load like transformers runs them; load-time nf4."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import bitsandbytes
import pytest
import torch
from quant_helpers import logits, rel_err, save_tiny_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from speclite import LLM, SamplingParams
from speclite.errors import SpecliteError
from speclite.model import load_model
from speclite.model.decoder import Linear
from speclite.quant import quantize_model, quantize_to_dir
from speclite.quant.bnb import Bnb4bitLinear, Bnb8bitLinear, int8_linear, quant_state
from speclite.quant.linear import Int8Linear

CONFIGS = {
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.bfloat16),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=False),
    "int8": dict(load_in_8bit=True),
}
# Relative L2 error of speclite's logits (CPU paths, fp32 model), max over 5 token draws:
# vs transformers running bitsandbytes on the CPU: nf4 0.0031, fp4 0.0035, int8 0.0061 (a bf16 fused
# 4-bit op there; int8 activations with the outlier split there, bf16 activations in our int8 op);
# vs transformers with bitsandbytes' own dequantized weights: 4-bit 0 (same fp32 weights), int8 0.0026.
VS_BNB = {"nf4": 0.007, "fp4": 0.007, "int8": 0.012}
VS_DEQUANTIZED = {"nf4": 1e-5, "fp4": 1e-5, "int8": 0.005}
PATHS = {"nf4": "dequantized", "fp4": "dequantized", "int8": "int8pack"}
INSTALL = r"needs bitsandbytes: pip install 'speclite\[bnb\]'"


def hf_bnb(dense, out, **config):
    """transformers quantizes the dense model with bitsandbytes on the CPU and saves it."""
    config = BitsAndBytesConfig(**config)
    AutoModelForCausalLM.from_pretrained(dense, quantization_config=config, device_map="cpu").save_pretrained(out)
    return out


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(tokens[None]).logits[0].float()


def hf_dequantized(path):
    """transformers' model of a bnb checkpoint, each bnb linear replaced by bitsandbytes' dequantization."""
    model = AutoModelForCausalLM.from_pretrained(path, device_map="cpu")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, bitsandbytes.nn.Linear4bit):
                w = bitsandbytes.functional.dequantize_4bit(child.weight.data, child.weight.quant_state)
            elif isinstance(child, bitsandbytes.nn.Linear8bitLt):
                w = bitsandbytes.functional.int8_vectorwise_dequant(child.weight.data, child.weight.SCB)
            else:
                continue
            dense = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
            with torch.no_grad():
                dense.weight.copy_(w.float())
                if child.bias is not None:
                    dense.bias.copy_(child.bias.float())
            setattr(parent, name, dense)
    return model


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    # Qwen2 (q/k/v biases). K = 192: bitsandbytes' own CPU 4-bit forward needs K % 64 == 0.
    return save_tiny_model(tmp_path_factory.mktemp("bnb") / "dense", hidden=64, intermediate=192, seed=4)


@pytest.fixture(scope="module")
def ckpts(dense):
    return {name: hf_bnb(dense, dense.parent / name, **config) for name, config in CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_checkpoint_logits_match_transformers(ckpts, name):
    tokens = torch.randint(0, 300, (32,))
    model = load_model(ckpts[name])
    ours = logits(model, tokens)
    assert {m.path for m in model.modules() if hasattr(m, "path")} == {PATHS[name]}
    assert type(model.lm_head) is Linear
    reference = hf_dequantized(ckpts[name])
    assert rel_err(ours, hf_logits(reference, tokens)) < VS_DEQUANTIZED[name]
    transformers_bnb = AutoModelForCausalLM.from_pretrained(ckpts[name], device_map="cpu")
    assert rel_err(ours, hf_logits(transformers_bnb, tokens)) < VS_BNB[name]
    # Quantization did something: the dense model is farther away than either reference.
    assert rel_err(ours, logits(load_model(ckpts[name].parent / "dense"), tokens)) > VS_BNB[name] / 4


@pytest.mark.parametrize("bits", [4, 8])
def test_skip_modules_stay_dense_and_a_quantized_lm_head_is_dequantized(tmp_path, bits):
    """With llm_int8_skip_modules set, transformers quantizes an untied lm_head too."""
    dense = save_tiny_model(tmp_path / "dense", hidden=64, intermediate=192, seed=5, tie=False, family="llama")
    path = hf_bnb(dense, tmp_path / "skip", **{f"load_in_{bits}bit": True, "llm_int8_skip_modules": ["down_proj"]})
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight.absmax" in f.keys() or "lm_head.SCB" in f.keys()
    model = load_model(path)
    assert type(model.model.layers[1].mlp.down_proj) is Linear and type(model.lm_head) is Linear
    assert type(model.model.layers[1].mlp.up_proj) in (Bnb4bitLinear, Int8Linear)
    tokens = torch.randint(0, 300, (32,))
    assert rel_err(logits(model, tokens), hf_logits(hf_dequantized(path), tokens)) < VS_DEQUANTIZED["int8"]


def llm_int8(x, cb, scb, threshold):
    """LLM.int8 from its definition: input columns with any |x| >= threshold multiply the
    dequantized weight in fp16, the rest are quantized per row to int8 (absmax / 127)."""
    x = x.half().float()
    outliers = (x.abs() >= threshold).any(0)
    inliers = x.masked_fill(outliers, 0)
    sx = inliers.abs().amax(1, keepdim=True) / 127
    y = ((inliers / sx).round() @ cb.float().t()) * sx * (scb / 127)
    return y + x[:, outliers] @ (cb.float()[:, outliers] * scb[:, None] / 127).t()


def q_proj(ckpt, name, kernels: bool):
    """Layer 0's q_proj of a checkpoint as speclite loads it: bitsandbytes' own ops (kernels=True; they
    run on the CPU too) or speclite's CPU path; and its weight dequantized, and its bias."""
    from safetensors.torch import load_file

    tensors = load_file(str(ckpt / "model.safetensors"))
    module = "model.layers.0.self_attn.q_proj"
    weight, bias = tensors[f"{module}.weight"], tensors[f"{module}.bias"]
    if name == "int8":
        scb = tensors[f"{module}.SCB"]
        return (int8_linear(weight, scb, 6.0, bias, torch.float32, "cpu", kernels=kernels),
                weight.float() * scb[:, None] / 127, bias)
    state = quant_state(tensors, module, "cpu")
    return (Bnb4bitLinear(weight, state, bias, torch.float32, "cpu", kernels),
            bitsandbytes.functional.dequantize_4bit(weight, state), bias)


@pytest.mark.parametrize("name", CONFIGS)
def test_bitsandbytes_ops_match_the_cpu_path(ckpts, name):
    x = torch.randn(5, 64)
    x[:, 7] *= 20  # an outlier column above llm_int8_threshold (6)
    x[:, 3] = 5.5  # large but below it: int8 rounding of the other activations becomes visible
    (ops, dequantized, bias), (cpu, _, _) = q_proj(ckpts[name], name, True), q_proj(ckpts[name], name, False)
    if name == "int8":
        assert (type(ops), ops.path, type(cpu), cpu.path) == (Bnb8bitLinear, "bnb_int8", Int8Linear, "int8pack")
        weight, scb = ops.weight, ops.SCB
    else:
        assert (ops.path, cpu.path) == ("bnb_matmul_4bit", "dequantized")
    with torch.no_grad():
        y_ops, y_cpu = ops(x), cpu(x)
    plain = torch.nn.functional.linear(x, dequantized, bias)
    if name == "int8":
        # Measured: vs LLM.int8 2.8e-4 (fp16 output); without the outlier split 0.025, with a
        # dequantize-and-matmul route (bitsandbytes' training state) 0.006.
        each_row = torch.cat([llm_int8(row[None], weight, scb, 6.0) for row in x])  # bnb.rows_alone
        assert rel_err(y_ops, each_row + bias) < 1e-3
        assert rel_err(y_cpu, plain) < 0.01  # measured 0.003: bf16 activations in the int8pack op
        assert rel_err(y_ops, y_cpu) < 0.02  # measured 0.007
    else:
        torch.testing.assert_close(y_ops, y_cpu, rtol=1e-5, atol=1e-5)  # measured equal: same fp32 weights
        torch.testing.assert_close(y_cpu, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", CONFIGS)
def test_bitsandbytes_ops_give_a_row_its_one_row_numbers(ckpts, name):
    """A verification's k + 1 rows get what plain decoding's one-row steps get, bit for bit, though
    one row's outlier would put the column in 16 bits for all (measured apart before: int8 0.023,
    nf4 2e-5), so greedy speculation keeps plain decoding's tokens."""
    ops, _, _ = q_proj(ckpts[name], name, True)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    x[2, 7] = 30.0  # one row's outlier
    with torch.no_grad():
        assert torch.equal(ops(x), torch.cat([ops(x[i:i + 1]) for i in range(5)]))


def test_load_time_nf4_is_bitsandbytes_quantization(dense):
    bnbf = bitsandbytes.functional
    original = load_model(dense)
    model = quantize_model(load_model(dense), "NF4")
    for block, qblock in zip(original.model.layers, model.model.layers):
        for name in ("self_attn.q_proj", "mlp.down_proj"):
            w = block.get_submodule(name).weight
            packed, state = bnbf.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
            qlinear = qblock.get_submodule(name)
            assert type(qlinear) is Bnb4bitLinear and qlinear.path == "dequantized"
            torch.testing.assert_close(qlinear.weight, bnbf.dequantize_4bit(packed, state), rtol=0, atol=0)
    tokens = torch.randint(0, 300, (32,))
    err = rel_err(logits(model, tokens), logits(original, tokens))
    assert 0.01 < err < 0.2  # measured 0.10 (4 bits on random weights, like int4's 0.09)
    with pytest.raises(SpecliteError, match="load time only"):
        quantize_to_dir(dense, dense.parent / "never", "nf4")


def test_missing_bitsandbytes_is_one_line(ckpts, dense, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` now raises ImportError
    for load in (lambda: load_model(ckpts["nf4"]), lambda: quantize_model(load_model(dense), "nf4")):
        with pytest.raises(SpecliteError, match=INSTALL) as e:
            load()
        assert "\n" not in str(e.value)


def test_bad_bitsandbytes_configs_are_one_line_errors(ckpts, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(ckpts["nf4"], bad)
    config = json.loads((bad / "config.json").read_text())
    for change, message in [({"bnb_4bit_quant_storage": "bfloat16"}, "quant_storage 'bfloat16'"),
                            ({"load_in_4bit": False}, "neither load_in_4bit nor load_in_8bit")]:
        qconfig = {**config["quantization_config"], **change}
        (bad / "config.json").write_text(json.dumps({**config, "quantization_config": qconfig}))
        with pytest.raises(SpecliteError, match=message):
            load_model(bad)


def _cli(args, tmp_path, prelude=""):
    code = f"import sys\n{prelude}\nsys.argv = ['speclite'] + {args!r}\nfrom speclite.cli import main\nmain()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)


def test_cli_generate_quant_nf4(pair, tmp_path):
    prompts = ["def add(a, b):", "the quick brown"]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    args = ["generate", "--model", str(pair[0]), "--quant", "nf4", "-i", str(inp), "-o", str(out),
            "--max-new-tokens", "12"]
    r = _cli(args, tmp_path)
    assert r.returncode == 0, r.stderr
    expected = LLM(pair[0], quant="nf4").generate(prompts, SamplingParams(max_new_tokens=12))
    records = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["id"])
    assert [r["token_ids"] for r in records] == [o.token_ids for o in expected]

    out.unlink()
    r = _cli(args, tmp_path, prelude="sys.modules['bitsandbytes'] = None")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["error: --quant nf4 needs bitsandbytes: pip install 'speclite[bnb]'"]
