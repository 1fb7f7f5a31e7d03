"""Our writer's tensors, read back by independent readers written from the format definitions."""

from __future__ import annotations

import json

import pytest
import torch
from quant_helpers import logits, rel_err, save_tiny_model
from safetensors.torch import load_file

import speclite.quant.quantize as quantize_mod
from speclite.errors import SpecliteError
from speclite.model import load_model
from speclite.quant import normalize_scheme, quantize_to_dir
from speclite.quant.checkpoint import load_quantized_linears
from speclite.quant.fp8 import quantize_fp8_blocks
from speclite.quant.int4 import quantize_rtn, to_gptq


@pytest.fixture(autouse=True)
def short_perplexity(monkeypatch):
    monkeypatch.setattr(quantize_mod, "PPL_TOKENS", 256)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # hidden 96 and intermediate 160: neither is a multiple of 128, so edge blocks/groups are partial.
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=96, intermediate=160, heads=4, kv_heads=2)


def _dense(path):
    return load_file(str(path / "model.safetensors"))


def test_fp8_dequantizes_block_by_block(tiny, tmp_path):
    out = tmp_path / "fp8"
    report = quantize_to_dir(tiny, out, "fp8-block")
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    src, q = _dense(tiny), _dense(out)
    name = "model.layers.1.mlp.down_proj"  # [96, 160]: one full and one partial block along K
    w, scale = q[f"{name}.weight"], q[f"{name}.weight_scale_inv"]
    assert w.dtype == torch.float8_e4m3fn and w.shape == (96, 160)
    assert scale.dtype == torch.float32 and scale.shape == (1, 2)
    orig = src[f"{name}.weight"].float()
    for bi in range(scale.shape[0]):
        for bj in range(scale.shape[1]):
            rows, cols = slice(bi * 128, (bi + 1) * 128), slice(bj * 128, (bj + 1) * 128)
            block = w[rows, cols].float() * scale[bi, bj]
            # e4m3 keeps 3 mantissa bits: relative rounding error <= 2^-4 of the value (plus subnormals).
            tol = orig[rows, cols].abs() * 2**-4 + scale[bi, bj] * 2**-9
            assert ((block - orig[rows, cols]).abs() <= tol).all()
            assert orig[rows, cols].abs().max() / scale[bi, bj] == pytest.approx(448, rel=1e-5)
    assert "model.embed_tokens.weight" in q and q["model.embed_tokens.weight"].dtype == src["model.embed_tokens.weight"].dtype
    assert report.quantized_linears == 14 and report.bytes_after < report.bytes_before


def test_gptq_unpacks_by_the_format_definition(tiny, tmp_path):
    out = tmp_path / "int4"
    quantize_to_dir(tiny, out, "int4", group_size=64)
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "gptq" and cfg["bits"] == 4 and cfg["group_size"] == 64
    assert cfg["checkpoint_format"] == "gptq" and cfg["sym"] is False and cfg["desc_act"] is False
    q = _dense(out)
    name = "model.layers.0.mlp.down_proj"  # K = 160: groups of 64, 64 and a last one of 32
    qweight, qzeros, scales, g_idx = (q[f"{name}.{s}"] for s in ("qweight", "qzeros", "scales", "g_idx"))
    assert qweight.dtype == torch.int32 and qweight.shape == (160 // 8, 96)
    assert qzeros.dtype == torch.int32 and qzeros.shape == (3, 96 // 8)
    assert scales.dtype == torch.float16 and scales.shape == (3, 96)
    assert g_idx.tolist() == [k // 64 for k in range(160)]
    # Independent reader: python ints, one nibble at a time.
    words = qweight.tolist()
    zwords = qzeros.tolist()
    deq = torch.empty(96, 160)
    for k in range(160):
        for n in range(96):
            value = (words[k // 8][n] & 0xFFFFFFFF) >> (4 * (k % 8)) & 0xF
            stored_zero = (zwords[k // 64][n // 8] & 0xFFFFFFFF) >> (4 * (n % 8)) & 0xF
            deq[n, k] = (value - (stored_zero + 1)) * scales[k // 64, n].item()  # v1: stored zero = zero - 1
    expected = quantize_rtn(_dense(tiny)[f"{name}.weight"], 64, sym=False)
    assert torch.equal(deq, expected.dequantize())
    orig = _dense(tiny)[f"{name}.weight"].float()
    step = scales.float()[g_idx.long()].t()
    assert ((deq - orig).abs() <= step * 0.5 + 1e-6).all()  # round to nearest within range


def test_w8a8_loads_with_compressed_tensors(tiny, tmp_path):
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM

    out = tmp_path / "w8a8"
    quantize_to_dir(tiny, out, "w8a8")
    q = _dense(out)
    assert q["model.layers.0.self_attn.q_proj.weight"].dtype == torch.int8
    assert q["model.layers.0.self_attn.q_proj.weight_scale"].shape == (96, 1)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokens = torch.randint(0, 300, (24,))
    with torch.no_grad():
        theirs = hf(tokens[None]).logits[0]
    ours = logits(load_model(out), tokens)
    dense = logits(load_model(tiny), tokens)
    # compressed-tensors quantizes activations with amax/127.5 into [-128, 127]; we (like vLLM)
    # use amax/127 into [-127, 127]: the two differ by activation rounding only.
    assert rel_err(ours, theirs) < 0.02
    assert rel_err(theirs, dense) < 0.03


def test_scheme_aliases_and_bad_input(tiny, tmp_path):
    assert [normalize_scheme(s) for s in ("FP8_PER_BLOCK", "int4", "W8A8", "fp8-block")] == ["fp8-block", "int4", "w8a8", "fp8-block"]
    with pytest.raises(SpecliteError, match="unknown quantization scheme"):
        normalize_scheme("int3")
    for method in ("gptq", "awq"):
        with pytest.raises(SpecliteError, match="does not apply"):
            quantize_to_dir(tiny, tmp_path / "a", "fp8-block", method=method)
    with pytest.raises(SpecliteError, match="--sym does not apply to --method awq"):
        quantize_to_dir(tiny, tmp_path / "a", "int4", method="awq", sym=True)
    with pytest.raises(SpecliteError, match=r"--method awq needs .* multiple of 64 .*k_proj.weight is \d+ x"):
        quantize_to_dir(save_tiny_model(tmp_path / "narrow", hidden=64, intermediate=128), tmp_path / "a", "int4",
                        method="awq", group_size=32)
    assert not (tmp_path / "a").exists()
    with pytest.raises(SpecliteError, match="cannot read calibration file"):
        quantize_to_dir(tiny, tmp_path / "b", "int4", method="gptq", calib=tmp_path / "missing.txt")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(SpecliteError, match="not empty"):
        quantize_to_dir(tiny, tmp_path / "full", "int4")
    with pytest.raises(SpecliteError, match="unsupported quant_method 'hqq'.*fp8, gptq, awq, compressed-tensors"):
        load_quantized_linears(torch.nn.Module(), {"quant_method": "hqq"}, {}, torch.float32, "cpu")


@pytest.mark.parametrize("scheme,scale", [("fp8-block", "weight_scale_inv"), ("w8a8", "weight_scale")])
def test_quantized_weight_without_its_scale_is_named(tiny, tmp_path, scheme, scale):
    from safetensors.torch import save_file

    out = tmp_path / scheme
    quantize_to_dir(tiny, out, scheme)
    tensors = _dense(out)
    del tensors[f"model.layers.1.mlp.up_proj.{scale}"]
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(SpecliteError, match=rf"checkpoint: 'model\.layers\.1\.mlp\.up_proj\.{scale}' is missing"):
        load_model(out)


def test_packing_helpers_reject_unpackable_shapes():
    w = quantize_rtn(torch.randn(12, 64), 32, sym=True)
    with pytest.raises(SpecliteError, match="divisible by 8"):
        to_gptq(w, "odd")
    values, scale = quantize_fp8_blocks(torch.randn(130, 20), (128, 128))
    assert values.shape == (130, 20) and scale.shape == (2, 1)


def test_load_time_quantizers_stay_on_the_weights_device():
    """A GPU's weights quantize on the GPU (a 7B model's int4 and fp8 went through the CPU, minutes on
    the device's cores): every tensor the quantizers make is on the weight's device, shown here with
    the meta device, which has no data to copy anywhere."""
    from speclite.quant.int8 import quantize_int8_channel

    w = torch.empty(256, 384, device="meta")
    q = quantize_rtn(w, 128, sym=False)
    values, scale = quantize_fp8_blocks(w)
    assert {t.device.type for t in (q.q, q.scales, q.zeros, values, scale, *quantize_int8_channel(w))} == {"meta"}
