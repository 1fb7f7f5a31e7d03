"""quantize_to_dir -> load_model round trips, load-time quantize_model, and the kernel path."""

from __future__ import annotations

import json

import pytest
import torch
from quant_helpers import Recorder, logits, rel_err, save_tiny_model

import speclite.quant.quantize as quantize_mod
from speclite.errors import SpecliteError
from speclite.kernels import cpu_gemm
from speclite.model import load_model
from speclite.model.decoder import Linear
from speclite.quant import quantize_model, quantize_to_dir
from speclite.quant.fp8 import quantize_fp8_blocks
from speclite.quant.int4 import quantize_rtn
from speclite.quant.int8 import quantize_int8_channel
from speclite.quant.linear import Fp8Linear, Int4Linear, Int8Linear

# Relative L2 error of the logits vs the original model, per scheme (measured ~0.02 / ~0.09 / ~0.01).
BOUNDS = {"fp8-block": 0.05, "int4": 0.2, "w8a8": 0.025}


@pytest.fixture(autouse=True)
def short_perplexity(monkeypatch):
    monkeypatch.setattr(quantize_mod, "PPL_TOKENS", 256)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=64, intermediate=160, seed=1)


@pytest.mark.parametrize("scheme,group_size,path", [
    ("fp8-block", 128, "dequantized"),
    ("int4", 128, "dequantized"),  # group 128 > K = 64: the packed CPU op cannot take it
    ("int4", 32, "cpu_int4" if cpu_gemm.available() else "int4pack"),
    ("w8a8", 128, "cpu_w8a8" if cpu_gemm.available() else "int8pack"),
])
def test_round_trip_logits_stay_close(tiny, tmp_path, scheme, group_size, path):
    out = tmp_path / "q"
    report = quantize_to_dir(tiny, out, scheme, group_size=group_size)
    tokens = torch.randint(0, 300, (32,))
    original = logits(load_model(tiny), tokens)
    model = load_model(out)
    quantized = logits(model, tokens)
    assert rel_err(quantized, original) < BOUNDS[scheme]
    assert {m.path for m in model.modules() if hasattr(m, "path")} == {path}
    assert type(model.lm_head) is Linear and model.lm_head.weight is model.model.embed_tokens.weight
    assert report.ppl_after == pytest.approx(report.ppl_before, rel=0.1)
    assert (out / "tokenizer.json").exists() and (out / "generation_config.json").exists()

    # Load-time RTN of the dense model gives the very same model as the written checkpoint.
    in_place = quantize_model(load_model(tiny), scheme.upper().replace("FP8-BLOCK", "FP8_PER_BLOCK"), group_size=group_size)
    torch.testing.assert_close(logits(in_place, tokens), quantized, rtol=1e-4, atol=1e-4)
    with pytest.raises(SpecliteError, match="already quantized"):
        quantize_model(model, "int4")


def test_load_time_head_quantization_is_opt_in(tiny):
    """BODY/HEAD: the head gets its own quantized copy; the (tied) embeddings stay as they were."""
    tokens = torch.randint(0, 300, (24,))
    reference = logits(load_model(tiny), tokens)
    body_only = quantize_model(load_model(tiny), "int4", group_size=32)
    assert type(body_only.lm_head) is Linear
    model = load_model(tiny)
    embedding = model.model.embed_tokens.weight.clone()
    quantize_model(model, "int4/w8a8", group_size=32)
    assert isinstance(model.lm_head, Int8Linear) and model.lm_head.out_features == 300
    assert torch.equal(model.model.embed_tokens.weight, embedding)
    # The head's own error: the int8 head on top of int4 linears moves logits by far less than int4 does.
    with_head = logits(model, tokens)
    assert rel_err(with_head, logits(body_only, tokens)) < 0.02
    assert rel_err(with_head, reference) < BOUNDS["int4"]
    int8_head = quantize_int8_channel(load_model(tiny).lm_head.weight.detach())
    packed = model.lm_head.path == "cpu_w8a8"  # the AVX2 kernel's layout
    torch.testing.assert_close(model.lm_head.weight, cpu_gemm.pack_int8(int8_head[0]) if packed else int8_head[0])
    with pytest.raises(SpecliteError, match="unknown quantization scheme 'int3'"):
        quantize_model(load_model(tiny), "int4/int3")


def test_large_checkpoints_are_sharded(tiny, tmp_path):
    seen = Recorder()
    quantize_to_dir(tiny, tmp_path / "sharded", "w8a8", shard_bytes=60_000, progress=seen)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and all((tmp_path / "sharded" / f).exists() for f in files)
    assert "model.layers.1.mlp.down_proj.weight_scale" in index["weight_map"]
    # Every source tensor reported once, with its size: the bar's total is reached exactly.
    assert len(seen.tensors) == seen.total[0] and sum(n for _, n in seen.tensors) == seen.total[1]
    quantize_to_dir(tiny, tmp_path / "single", "w8a8")
    tokens = torch.randint(0, 300, (8,))
    torch.testing.assert_close(logits(load_model(tmp_path / "sharded"), tokens), logits(load_model(tmp_path / "single"), tokens))


def _kernel_vs_cpu(make, x):
    with torch.no_grad():
        return make(True)(x), make(False)(x)


def test_kernel_path_matches_cpu_path():
    """The tensors handed to speclite.kernels (torch reference on the CPU) compute the same layer."""
    torch.manual_seed(0)
    w, bias, x = torch.randn(48, 256) * 0.05, torch.randn(48) * 0.1, torch.randn(5, 256)
    dense = torch.nn.functional.linear(x, w, bias)

    values, scale = quantize_fp8_blocks(w)
    k, c = _kernel_vs_cpu(lambda kern: Fp8Linear(values, scale, (128, 128), bias, torch.float32, "cpu", kern), x)
    assert rel_err(k, c) < 0.05 and rel_err(c, dense) < 0.05  # kernel path also quantizes x to fp8
    per_tensor = (w.abs().max() / 448).reshape(())  # fp8 checkpoints without weight_block_size
    values = (w / per_tensor).to(torch.float8_e4m3fn)
    k, c = _kernel_vs_cpu(lambda kern: Fp8Linear(values, per_tensor, (0, 0), bias, torch.float32, "cpu", kern), x)
    assert rel_err(k, c) < 0.05 and rel_err(c, dense) < 0.05

    q, s = quantize_int8_channel(w)
    k, c = _kernel_vs_cpu(lambda kern: Int8Linear(q, s, bias, torch.float32, "cpu", kern), x)
    weight_only = torch.nn.functional.linear(x, q.float() * s, bias)
    assert rel_err(c, weight_only) < 0.01  # CPU: the AVX2 W8A8 kernel, or the weight-only int8 op
    assert rel_err(k, weight_only) < 0.02  # kernel: activations quantized per token too
    assert rel_err(k, c) > 0 and rel_err(c, dense) < 0.02

    for act_order in (False, True):
        q4 = quantize_rtn(w, 64, sym=False)
        if act_order:  # a desc_act-style g_idx: groups scattered over the input channels
            perm = torch.randperm(256)
            q4.q, q4.g_idx = q4.q[:, perm], q4.g_idx[perm]
        k, c = _kernel_vs_cpu(lambda kern: Int4Linear(q4, bias, torch.float32, "cpu", kern), x)
        reference = torch.nn.functional.linear(x, q4.dequantize(), bias)
        assert rel_err(k, reference) < 1e-5
        assert rel_err(c, reference) < 0.01  # CPU: int8 (AVX2 kernel) or bf16 (int4pack) activations
        # The kernel path stores act-order channels in group order (x gathered per call): no g_idx left.
        layer = Int4Linear(q4, bias, torch.float32, "cpu", True)
        assert layer.g_idx is None and (layer.perm is not None) == act_order
    # Groups of uneven sizes cannot be put in order: the kernel gathers each channel's group.
    q4 = quantize_rtn(w, 64, sym=False)
    q4.g_idx = torch.randint(0, 4, (256,), generator=torch.Generator().manual_seed(3)).int()
    layer = Int4Linear(q4, bias, torch.float32, "cpu", True)
    assert layer.perm is None and torch.equal(layer.g_idx, q4.g_idx)
    with torch.no_grad():
        assert rel_err(layer(x), torch.nn.functional.linear(x, q4.dequantize(), bias)) < 1e-5


@pytest.mark.parametrize("kind,n,k,group", [
    ("int8", 40, 24, None),  # K % 16 != 0: the int8 op would crash
    ("int4", 24, 64, 32),  # N % 16 != 0
    ("int4", 32, 96, 48),  # group size the int4 op does not take
    ("int4", 32, 80, 32),  # last group partial
])
def test_cpu_fallback_for_shapes_the_packed_ops_refuse(kind, n, k, group, monkeypatch):
    monkeypatch.setattr(cpu_gemm, "available", lambda: False)  # the torch ops' own limits
    torch.manual_seed(1)
    w, x = torch.randn(n, k) * 0.05, torch.randn(3, k)
    if kind == "int8":
        q, s = quantize_int8_channel(w)
        layer, deq = Int8Linear(q, s, None, torch.float32, "cpu"), q.float() * s
    else:
        q4 = quantize_rtn(w, group, sym=True)
        layer, deq = Int4Linear(q4, None, torch.float32, "cpu"), q4.dequantize()
    assert layer.path == "dequantized"
    torch.testing.assert_close(layer(x), x @ deq.t())
