"""Calibration methods: GPTQ beats round-to-nearest, SmoothQuant beats plain W8A8 on outliers."""

from __future__ import annotations

import json

import pytest
import torch
from quant_helpers import logits, rel_err, save_tiny_model, tiny_tokenizer
from safetensors.torch import load_file

import speclite.quant.quantize as quantize_mod
from speclite.model import load_model
from speclite.quant import quantize_to_dir
from speclite.quant.calib import SHIPPED_HELDOUT
from speclite.quant.gptq import HessianAccumulator, gptq_quantize
from speclite.quant.int4 import quantize_rtn
from speclite.quant.linear import Int8Linear


@pytest.fixture(autouse=True)
def short_perplexity(monkeypatch):
    monkeypatch.setattr(quantize_mod, "PPL_TOKENS", 256)


@pytest.mark.parametrize("sym,act_order,group", [(False, False, 32), (True, True, 48), (False, True, 64)])
def test_gptq_lowers_reconstruction_error(sym, act_order, group):
    torch.manual_seed(3)
    # Correlated activations with uneven channel scales, as real hidden states have.
    x = (torch.randn(512, 24) @ torch.randn(24, 128) + 0.1 * torch.randn(512, 128)) * torch.rand(128) * 2
    w = torch.randn(64, 128) * 0.05
    acc = HessianAccumulator(128, "cpu")
    for chunk in x.split(100):
        acc.add(chunk)
    torch.testing.assert_close(acc.h, 2 * x.t() @ x / 512, rtol=1e-4, atol=1e-3)
    gptq = gptq_quantize(w, acc.h, group, sym, act_order)
    rtn = quantize_rtn(w, group, sym)

    def err(q):
        return (x @ (w - q.dequantize()).t()).norm().item()

    assert err(gptq) < 0.7 * err(rtn)
    assert gptq.q.max() <= 15 and gptq.scales.shape == (-(-128 // group), 64)
    if act_order:
        assert not torch.equal(gptq.g_idx.long(), torch.arange(128) // group)
        assert sorted(torch.bincount(gptq.g_idx.long()).tolist(), reverse=True)[0] == min(group, 128)


def test_gptq_end_to_end_with_act_order_and_jsonl_calib(tmp_path):
    model = save_tiny_model(tmp_path / "model", hidden=64, intermediate=128, seed=4)
    calib = tmp_path / "calib.jsonl"
    text = SHIPPED_HELDOUT.read_text()
    calib.write_text("\n".join(json.dumps({"text": text[i:i + 2000]}) for i in range(0, 20000, 2000)))
    seen = []
    report = quantize_to_dir(model, tmp_path / "gptq", "int4", method="gptq", group_size=32, act_order=True,
                             calib=calib, calib_samples=8, seq_len=64, progress=seen.append)
    assert report.method == "gptq" and report.quantized_linears == 14
    assert len([m for m in seen if m.startswith("gptq ")]) == 14
    cfg = json.loads((tmp_path / "gptq" / "config.json").read_text())["quantization_config"]
    assert cfg["desc_act"] is True
    g_idx = load_file(str(tmp_path / "gptq" / "model.safetensors"))["model.layers.0.mlp.down_proj.g_idx"]
    assert not torch.equal(g_idx.long(), torch.arange(128) // 32)
    tokens = torch.tensor(tiny_tokenizer()(text[:400])["input_ids"][:48])
    loaded = load_model(tmp_path / "gptq")
    assert {m.path for m in loaded.modules() if hasattr(m, "path")} == {"int4pack"}  # act-order via a column permutation
    assert rel_err(logits(loaded, tokens), logits(load_model(model), tokens)) < 0.2
    assert report.ppl_after == pytest.approx(report.ppl_before, rel=0.1)


def w8a8_logits(path, tokens):
    """Logits with true W8A8 numerics (per-token activation quantization: the kernel path, whose
    CPU fallback is the kernels' torch reference); the CPU default path is weight-only int8."""
    model = load_model(path)
    tensors = load_file(str(path / "model.safetensors"))
    for name, m in list(model.named_modules()):
        if isinstance(m, Int8Linear):
            parent, _, attr = name.rpartition(".")
            w8a8 = Int8Linear(tensors[f"{name}.weight"], tensors[f"{name}.weight_scale"], m.bias, torch.float32, "cpu", kernels=True)
            setattr(model.get_submodule(parent), attr, w8a8)
    return logits(model, tokens)


def test_smoothquant_beats_plain_w8a8_on_outlier_channels(tmp_path):
    model = save_tiny_model(tmp_path / "model", hidden=64, intermediate=128, seed=5, outliers=True)
    quantize_to_dir(model, tmp_path / "rtn", "w8a8")
    smooth = quantize_to_dir(model, tmp_path / "sq", "w8a8", method="smoothquant", alpha=0.5,
                             calib_samples=8, seq_len=64)
    tensors = load_file(str(tmp_path / "sq" / "model.safetensors"))
    original = load_file(str(model / "model.safetensors"))
    # Smoothing lives in the norms (and up_proj rows): the checkpoint keeps the standard tensors only.
    assert set(tensors) == set(load_file(str(tmp_path / "rtn" / "model.safetensors")))
    assert not torch.equal(tensors["model.layers.0.input_layernorm.weight"], original["model.layers.0.input_layernorm.weight"])
    tokens = torch.tensor(tiny_tokenizer()(SHIPPED_HELDOUT.read_text()[:600])["input_ids"][:64])
    reference = logits(load_model(model), tokens)
    err_plain = rel_err(w8a8_logits(tmp_path / "rtn", tokens), reference)
    err_smooth = rel_err(w8a8_logits(tmp_path / "sq", tokens), reference)
    assert err_smooth < 0.8 * err_plain
    # On the CPU path (weight-only int8) smoothing must not cost accuracy either.
    assert rel_err(logits(load_model(tmp_path / "sq"), tokens), reference) < 0.03
    assert smooth.ppl_after == pytest.approx(smooth.ppl_before, rel=0.05)
